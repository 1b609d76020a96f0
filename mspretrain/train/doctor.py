"""`train doctor`: the first command to run on a new cluster.

It climbs a ladder of three-step runs of a tiny Llama (hidden 64, 2 layers, 4 heads, 2 KV heads) on
the dataset of the config, each a real `train launch` with packed-document masking on (block-causal
attention, position reset, EOD loss mask: the shipped default):

  one device          the reference (every other rung is compared with it, same global batch)
  dp=N                N processes under msrun, data parallel
  mp=2                model parallel (Ascend)
  dp+opt-shard        data parallel with optimizer sharding (Ascend)
  pp=2                two pipeline stages, 2 micro-batches (Ascend)
  1 device, no mask   a second reference with the three document features off (Ascend: only the next
                      rung needs it)
  bf16+flash          bf16 with the fused flash-attention kernel, BNSD layout, no document mask
                      (Ascend), compared with "1 device, no mask"
  bf16+flash+docmask  bf16 with the kernel in TND layout over each sample's documents (Ascend)
  resume+eval         the dp=N rung again from its step-2 checkpoint (compile, then load), then step 3
                      and a validation: loss, grad norm and val loss bit for bit equal to the dp=N rung's

Each rung must finish, report step losses and gradient norms within TOLERANCE (relative) of the
reference's (bf16 within BF16_TOLERANCE), and leave bitwise-equal state digests (weights, AdamW
moments) on every rank of a replica group: data-parallel replicas hold the same tensors, sharded ones
are compared within their group. Rungs the device cannot run (CPU: mp, optimizer sharding, pp, bf16)
are listed as skipped. It prints a table; at the first failure it prints the failing worker's log tail
and exits 1.

The per-rank records come from this module's train.hooks callbacks (TRAIN_HOOKS=train.doctor,
DOCTOR_TRACE_DIR=DIR): after each step every rank appends {step, loss, grad_norm, state digest}.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

TRACE_ENV = "DOCTOR_TRACE_DIR"
# fp32: the same global batch, each rank's token-loss sum divided by the global token count, so the
# rungs differ from the one-device reference only by fp32 reduction order: a few regrouped additions of
# partial sums, each within u = 2**-24 (test_step.REDUCTION_ORDER_RTOL derives 16u = 1e-6)
TOLERANCE = 1e-6
BF16_TOLERANCE = 5e-2       # bf16 + flash attention against the fp32 reference
TAIL_LINES = 40
STEPS = 3                   # the resume rung restarts from the step-2 checkpoint and runs step 3
DOCUMENTS_ON = ("model.document_mask=true", "model.reset_position_ids=true", "train.eod_mask_loss=true")
DOCUMENTS_OFF = ("model.document_mask=false", "model.reset_position_ids=false", "train.eod_mask_loss=false")
TINY = ("model.hidden_size=64", "model.num_layers=2", "model.num_heads=4", "model.num_kv_heads=2",
        "model.ffn_size=0", "model.tie_embeddings=false", f"train.steps={STEPS}", "train.micro_batch_size=0",
        "checkpoint.every_steps=1", "checkpoint.keep_max=2", f"eval.every_steps={STEPS}", "eval.batches=1",
        "log.every_steps=1", "parallel.stage_offsets=[]", "parallel.sequence_parallel=false", *DOCUMENTS_ON)


# ---------------------------------------------------------------- the hook every rank runs

def install(hooks) -> None:
    directory = os.environ.get(TRACE_ENV)
    if directory:
        hooks.wrap_step = lambda step, dist, model: _Recorder(step, dist, Path(directory))


class _Recorder:
    def __init__(self, step, dist, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        self._step, self._path, self._calls = step, directory / f"rank_{dist.rank}.jsonl", 0

    def __getattr__(self, name):
        return getattr(self._step, name)

    def __call__(self, input_ids, lr):
        result = self._step(input_ids, lr)
        self._calls += 1
        digest = hashlib.sha256()
        params = self._step.state_parameters()
        for name in sorted(params):
            digest.update(name.encode())
            digest.update(params[name].asnumpy().tobytes())
        with open(self._path, "a") as f:
            f.write(json.dumps({"call": self._calls, "loss": result.loss, "grad_norm": result.grad_norm,
                                "state": digest.hexdigest()}) + "\n")
        return result


# ---------------------------------------------------------------- the ladder

@dataclass
class Rung:
    name: str
    nproc: int
    sets: tuple
    ascend_only: bool = False
    tolerance: float = TOLERANCE
    replica_groups: str = "all"       # which ranks must hold equal state: all | dp (ranks r, r+mp, ...)
    resume_of: str | None = None      # rerun of that rung from its step-(STEPS - 1) checkpoint
    reference: str | None = None      # the rung it is compared with (None: the first one)
    is_reference: bool = False        # a reference itself: compared with nothing
    needed_by: str = ""               # why it runs (a reference only some rung needs)
    status: str = "not run"
    detail: str = ""
    losses: list = field(default_factory=list)
    norms: list = field(default_factory=list)
    seconds: float = 0.0


def ladder(nproc: int) -> list[Rung]:
    half = max(1, nproc // 2)
    return [
        Rung("one device", 1, ("parallel.data_parallel=1",)),
        Rung(f"dp={nproc}", nproc, (f"parallel.data_parallel={nproc}",)),
        Rung("mp=2", 2 * half, (f"parallel.data_parallel={half}", "parallel.model_parallel=2"),
             ascend_only=True, replica_groups="none"),
        Rung(f"dp={nproc}+opt-shard", nproc, (f"parallel.data_parallel={nproc}", "parallel.optimizer_shard=true"),
             ascend_only=True, replica_groups="none"),
        Rung("pp=2 m=2", 2 * half, (f"parallel.data_parallel={half}", "parallel.pipeline_stage=2",
                                    "parallel.micro_batch_num=2"), ascend_only=True, replica_groups="none"),
        Rung("1 device, no mask", 1, ("parallel.data_parallel=1", *DOCUMENTS_OFF), ascend_only=True,
             is_reference=True, needed_by="bf16+flash"),
        Rung("bf16+flash", nproc, (f"parallel.data_parallel={nproc}", "precision.dtype=bf16",
                                   "model.flash_attention=true", *DOCUMENTS_OFF), ascend_only=True,
             tolerance=BF16_TOLERANCE, reference="1 device, no mask"),
        Rung("bf16+flash+docmask", nproc, (f"parallel.data_parallel={nproc}", "precision.dtype=bf16",
                                           "model.flash_attention=true"), ascend_only=True,
             tolerance=BF16_TOLERANCE),
        Rung("resume+eval", nproc, (f"parallel.data_parallel={nproc}",), resume_of=f"dp={nproc}"),
    ]


def run_doctor(config: str | None, sets: list[str], nproc: int, out: str | None, device: str) -> int:
    work = Path(out) if out else Path("runs") / "doctor"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    rungs = ladder(nproc)
    by_name = {r.name: r for r in rungs}
    reference = None
    failed = None
    for rung in rungs:
        if rung.ascend_only and device != "Ascend":
            rung.status = "skipped"
            rung.detail = "needs Ascend" + (f" (the reference of {rung.needed_by})" if rung.needed_by else "")
            continue
        if failed:
            rung.status = "not run"
            continue
        t0 = time.monotonic()
        ok, log = _run_rung(rung, config, sets, work, by_name)
        rung.seconds = time.monotonic() - t0
        if ok:
            ok = _check(rung, work, by_name[rung.reference] if rung.reference else reference, by_name)
        if not ok:
            rung.status = "FAILED"
            failed = (rung, log)
            continue
        rung.status = "ok"
        if reference is None:
            reference = rung
    print(format_table(rungs, reference))
    if failed:
        rung, log = failed
        print(f"\ntrain doctor: rung {rung.name!r} failed: {rung.detail}", file=sys.stderr)
        print(log, file=sys.stderr)
        return 1
    return 0


def _run_dir(work: Path, rung: Rung) -> Path:
    return work / rung.name.replace("=", "").replace("+", "_").replace(" ", "_")


def _run_rung(rung: Rung, config, sets, work: Path, by_name) -> tuple[bool, str]:
    run_dir = _run_dir(work, rung)
    cmd = [sys.executable, "-m", "mspretrain.train", "launch"]
    if config:
        cmd += ["--config", str(config)]
    cmd += ["--set", *sets, *TINY, *rung.sets, f"run.dir={run_dir}"]
    if rung.resume_of:
        source = _run_dir(work, by_name[rung.resume_of]) / "checkpoints" / f"step_{STEPS - 1:08d}"
        cmd += ["--resume", str(source)]
    if rung.nproc > 1:
        cmd += ["--nproc", str(rung.nproc)]
    env = dict(os.environ, TRAIN_HOOKS="mspretrain.train.doctor", **{TRACE_ENV: str(run_dir / "doctor")})
    print(f"[doctor] {rung.name}: " + " ".join(cmd[1:]), flush=True)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode == 0:
        return True, ""
    rung.detail = f"train launch exited {proc.returncode}"
    return False, _failure_log(proc, run_dir)


def _failure_log(proc, run_dir: Path) -> str:
    from mspretrain.train.launch import failed_logs, tail

    parts = [f"---- last {TAIL_LINES} lines of its output ----",
             "\n".join((proc.stdout + proc.stderr).splitlines()[-TAIL_LINES:])]
    log_dir = run_dir / "logs" / "msrun"
    if log_dir.is_dir():
        for path in failed_logs(log_dir):
            parts += [f"---- last {TAIL_LINES} lines of {path} ----", tail(path, TAIL_LINES)]
    return "\n".join(parts)


def _records(run_dir: Path) -> dict[int, list[dict]]:
    out = {}
    for path in sorted((run_dir / "doctor").glob("rank_*.jsonl")):
        out[int(path.stem.split("_")[1])] = [json.loads(x) for x in path.read_text().splitlines()]
    return out


def _metrics(run_dir: Path) -> list[dict]:
    from mspretrain.train.metrics import read_records

    return read_records(run_dir / "metrics.jsonl")


def _check(rung: Rung, work: Path, reference: Rung | None, by_name) -> bool:
    run_dir = _run_dir(work, rung)
    steps = [r for r in _metrics(run_dir) if not r.get("eval")]
    rung.losses = [r["loss"] for r in steps]
    rung.norms = [r["grad_norm"] for r in steps]
    ranks = _records(run_dir)
    if len(ranks) != rung.nproc or not all(ranks.values()):
        rung.detail = f"{len(ranks)} of {rung.nproc} ranks recorded steps"
        return False
    if rung.replica_groups == "all":
        for call in range(len(ranks[0])):
            digests = {r: recs[call]["state"] for r, recs in ranks.items()}
            if len(set(digests.values())) > 1:
                rung.detail = f"state digests differ across ranks after step call {call + 1}: {digests}"
                return False
    if rung.resume_of:
        source = by_name[rung.resume_of]
        mine = [r for r in _metrics(run_dir)]
        theirs = [r for r in _metrics(_run_dir(work, source)) if r["step"] >= STEPS]
        keys = ("step", "loss", "grad_norm", "val_loss")
        if [[r.get(k) for k in keys] for r in mine] != [[r.get(k) for k in keys] for r in theirs]:
            rung.detail = f"resumed step {STEPS} and eval differ from {source.name!r}: {mine} vs {theirs}"
            return False
        if ranks[0][-1]["state"] != _records(_run_dir(work, source))[0][-1]["state"]:
            rung.detail = f"state after the resumed step {STEPS} differs from {source.name!r}"
            return False
        return True
    if reference is None or rung.is_reference:
        return True
    if reference.status != "ok":
        rung.detail = f"its reference {reference.name!r} did not run ({reference.status})"
        return False
    for what, mine, ref in (("loss", rung.losses, reference.losses), ("grad norm", rung.norms, reference.norms)):
        if len(mine) != len(ref):
            rung.detail = f"{len(mine)} steps, the reference {len(ref)}"
            return False
        for step, (a, b) in enumerate(zip(mine, ref), start=1):
            if abs(a - b) > rung.tolerance * abs(b):
                rung.detail = (f"step {step} {what} {a!r} vs {reference.name} {b!r}: relative difference "
                               f"{abs(a - b) / abs(b):.2e} > {rung.tolerance:.0e}")
                return False
    return True


def format_table(rungs: list[Rung], reference: Rung | None) -> str:
    head = (f"{'rung':<18} {'procs':>5}  {'status':<8} {'loss (steps 1-3)':<30} {'grad norm (steps 1-3)':<30} "
            f"{'max rel diff':>12}  {'time':>6}  note")
    lines = [head, "-" * len(head)]
    by_name = {r.name: r for r in rungs}
    for r in rungs:
        diff = ""
        ref = by_name.get(r.reference) if r.reference else reference
        if (r.status == "ok" and ref is not None and ref.status == "ok" and r is not ref and not r.is_reference
                and not r.resume_of and r.losses):
            diff = f"{max(abs(a - b) / abs(b) for a, b in zip(r.losses + r.norms, ref.losses + ref.norms)):.1e}"
        losses = ", ".join(f"{x:.6f}" for x in r.losses)
        norms = ", ".join(f"{x:.6f}" for x in r.norms)
        secs = f"{r.seconds:.0f}s" if r.seconds else ""
        if r.status != "ok":
            note = r.detail
        elif r.resume_of:
            note = f"step {STEPS} + eval bitwise = {r.resume_of} rung"
        elif r is reference or r.is_reference:
            note = "reference"
        else:
            note = f"tol {r.tolerance:.0e}" + (f" vs {ref.name}" if r.reference else "")
        lines.append(f"{r.name:<18} {r.nproc:>5}  {r.status:<8} {losses:<30} {norms:<30} {diff:>12}  {secs:>6}  {note}")
    return "\n".join(lines)


def main(cfg, config: str | None, sets: list[str], nproc: int, out: str | None) -> int:
    """`train doctor`: cfg is the loaded config (its device picks the rungs)."""
    return run_doctor(config, sets, nproc, out or str(Path(cfg.run.dir) / "doctor"), cfg.device)
