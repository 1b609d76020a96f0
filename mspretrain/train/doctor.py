"""`train doctor`: the first command to run on a new cluster, on the user's own config.

The config is shrunk (`shrink`: width, depth, batch, keeping every divisibility rule) and keeps its
parallel layout, precision, recompute, accumulation, sequence parallel, vocabulary split, optimizer
sharding and document masking. It then climbs a ladder of three-step runs, each a real `train launch`
on the dataset of the config:

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
  your layout         the config's own dp x mp x pp and precision (when it is not one fp32 device)
  docmask kernel      the fused TND kernel against masked plain attention on fixed tensors (Ascend)
  resume+eval         the dp=N rung again from its step-2 checkpoint (compile, then load), then step 3
                      and a validation: loss, grad norm and val loss bit for bit equal to the dp=N rung's

Each rung must finish, report step losses and gradient norms within TOLERANCE (relative) of the
reference's (bf16 within BF16_TOLERANCE), and leave bitwise-equal state digests (weights, AdamW
moments) on every data-parallel replica (sharded rungs are not compared yet: "none"). Rungs the device cannot run (CPU: mp, optimizer sharding, pp, bf16)
are listed as skipped. It prints a table; at the first failure it prints the failing worker's log tail
and exits 1.

The per-rank records come from this module's train.hooks callbacks (TRAIN_HOOKS=train.doctor,
DOCTOR_TRACE_DIR=DIR): after each step every rank appends {step, loss, grad_norm, state digest}.
"""
from __future__ import annotations

import hashlib
import math
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
RUN = (f"train.steps={STEPS}", "checkpoint.every_steps=1", "checkpoint.keep_max=2", f"eval.every_steps={STEPS}",
       "eval.batches=1", "log.every_steps=1", "parallel.stage_offsets=[]")
# every rung starts from one flat layout and sets its own parallel keys on top
FLAT = ("parallel.data_parallel=1", "parallel.model_parallel=1", "parallel.pipeline_stage=1",
        "parallel.micro_batch_num=1", "parallel.optimizer_shard=false", "parallel.sequence_parallel=false",
        "parallel.vocab_emb_dp=true")
FP32 = ("precision.dtype=fp32",)


@dataclass(frozen=True)
class Shrunk:
    """The user's config made small: `sets` (width, depth, batch; everything else kept) and what the
    ladder derives from it."""
    sets: tuple
    features: tuple             # the features of the config the rungs keep, for the report
    notes: tuple                # what was replaced, and why
    layout: tuple               # the config's own parallel keys (its "your layout" rung)
    world: int                  # dp * mp * pp of the config
    precision: str
    docs: bool
    flash: bool
    accumulation: bool


def shrink(cfg, nproc: int, device: str) -> Shrunk:
    """Keep the config's parallel layout, precision, recompute, accumulation (K > 1), sequence parallel,
    vocabulary split, optimizer sharding and document masking; shrink width (16 per head, heads and
    KV heads and ffn divisible by model_parallel), depth (max(2, pipeline stages) layers) and batch
    (a global batch of 4 x nproc x micro-batches, divisible by every rung's data_parallel)."""
    p, m, t = cfg.parallel, cfg.model, cfg.train
    mp, pp = p.model_parallel, p.pipeline_stage
    heads = 4 * mp
    grouped = bool(m.num_kv_heads) and m.num_kv_heads < m.num_heads
    kv = max(mp, heads // 2) if grouped else 0
    layers = max(2, pp)
    accumulation = bool(t.micro_batch_size) and pp == 1
    # divisible by every rung's dp x micro-batches (4 x nproc) and by the config's own layout's
    batch = math.lcm(4 * nproc, p.data_parallel * (p.micro_batch_num if pp > 1 else 1) * (2 if accumulation else 1))
    sets = [f"model.hidden_size={16 * heads}", f"model.num_layers={layers}", f"model.num_heads={heads}",
            f"model.num_kv_heads={kv}", f"model.ffn_size={64 * mp}", "model.max_documents=8",
            f"train.global_batch_size={batch}", *RUN]
    features, notes = [], []
    if accumulation:        # K = 2 per rank at dp = nproc, 2 x nproc on one device: the same global batch
        sets.append("train.micro_batch_size=2")
        features.append("accumulation (micro_batch_size)")
    elif t.micro_batch_size:
        sets.append("train.micro_batch_size=0")
    r = cfg.recompute
    if r.mode == "full":
        sets.append('recompute.full_layers=""')
        features.append("recompute full")
    elif r.mode == "select":
        sets.append("recompute.select={" + ", ".join(f"{k}: '0-{layers - 1}'" for k in r.select) + "}")
        features.append("recompute select")
    if m.document_mask or m.reset_position_ids or t.eod_mask_loss:
        features.append("document masking")
    precision = cfg.precision.dtype
    if precision != "fp32":
        features.append(precision)
    if precision == "bf16" and device != "Ascend":
        notes.append("bf16 replaced by fp32: MindSpore has no bf16 kernels on CPU")
        precision = "fp32"
    flash = bool(m.flash_attention) and device == "Ascend" and precision != "fp32"
    if m.flash_attention:
        features.append("flash attention" + ("" if flash else " (Ascend 16-bit only: plain attention here)"))
    layout = [f"parallel.data_parallel={p.data_parallel}", f"parallel.model_parallel={mp}",
              f"parallel.pipeline_stage={pp}", f"parallel.micro_batch_num={p.micro_batch_num}",
              f"parallel.optimizer_shard={str(p.optimizer_shard).lower()}",
              f"parallel.sequence_parallel={str(p.sequence_parallel).lower()}",
              f"parallel.vocab_emb_dp={str(p.vocab_emb_dp).lower()}", f"precision.dtype={precision}"]
    if pp > 1:
        layout.append("eval.every_steps=0")        # no in-loop validation through stages (N3)
    for name, on in (("model parallel", mp > 1), ("pipeline", pp > 1), ("optimizer sharding", p.optimizer_shard),
                     ("sequence parallel", p.sequence_parallel), ("vocabulary split", not p.vocab_emb_dp)):
        if on:
            features.append(name)
    return Shrunk(tuple(sets), tuple(features), tuple(notes), tuple(layout),
                  p.data_parallel * mp * pp, precision, bool(m.document_mask), bool(m.flash_attention),
                  accumulation)


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
    needs_procs: int = 0              # devices it needs (the config's own layout), 0: nproc
    kernel: bool = False              # the one-device kernel check, not a training run
    status: str = "not run"
    detail: str = ""
    losses: list = field(default_factory=list)
    norms: list = field(default_factory=list)
    seconds: float = 0.0


def ladder(nproc: int, shrunk: Shrunk | None = None) -> list[Rung]:
    """The rungs: one device and dp=N in fp32 (the reference and its exact check), the parallel
    features one at a time, the config's own layout and precision when it differs from those, the
    16-bit and kernel rungs, and the resume. Every rung keeps the config's (shrunk) features."""
    half = max(1, nproc // 2)
    own = []
    if shrunk is not None and (shrunk.world > 1 or shrunk.precision != "fp32"):
        sharded = any(x in shrunk.layout for x in ("parallel.optimizer_shard=true",)) or any(
            x.startswith(("parallel.model_parallel=", "parallel.pipeline_stage=")) and not x.endswith("=1")
            for x in shrunk.layout)
        tol = TOLERANCE if shrunk.precision == "fp32" else BF16_TOLERANCE
        own.append(Rung("your layout", shrunk.world, shrunk.layout,
                        ascend_only=sharded or shrunk.precision != "fp32", tolerance=tol,
                        replica_groups="none" if sharded else "all",
                        needs_procs=shrunk.world))
    kernel = ([Rung("docmask kernel", 1, (), ascend_only=True, kernel=True)]
              if shrunk is None or (shrunk.docs and shrunk.flash) else [])
    return [
        Rung("one device", 1, ("parallel.data_parallel=1", *FP32)),
        Rung(f"dp={nproc}", nproc, (f"parallel.data_parallel={nproc}", *FP32)),
        Rung("mp=2", 2 * half, (f"parallel.data_parallel={half}", "parallel.model_parallel=2", *FP32),
             ascend_only=True, replica_groups="none"),
        Rung(f"dp={nproc}+opt-shard", nproc, (f"parallel.data_parallel={nproc}", "parallel.optimizer_shard=true",
                                              *FP32),
             ascend_only=True, replica_groups="none"),
        Rung("pp=2 m=2", 2 * half, (f"parallel.data_parallel={half}", "parallel.pipeline_stage=2",
                                    "parallel.micro_batch_num=2", "train.micro_batch_size=0",
                                    "eval.every_steps=0", *FP32), ascend_only=True, replica_groups="none"),
        Rung("1 device, no mask", 1, ("parallel.data_parallel=1", *DOCUMENTS_OFF, *FP32), ascend_only=True,
             is_reference=True, needed_by="bf16+flash"),
        Rung("bf16+flash", nproc, (f"parallel.data_parallel={nproc}", "precision.dtype=bf16",
                                   "model.flash_attention=true", *DOCUMENTS_OFF), ascend_only=True,
             tolerance=BF16_TOLERANCE, reference="1 device, no mask"),
        Rung("bf16+flash+docmask", nproc, (f"parallel.data_parallel={nproc}", "precision.dtype=bf16",
                                           "model.flash_attention=true", *DOCUMENTS_ON), ascend_only=True,
             tolerance=BF16_TOLERANCE),
        *own,
        *kernel,
        Rung("resume+eval", nproc, (f"parallel.data_parallel={nproc}", *FP32), resume_of=f"dp={nproc}"),
    ]


def run_doctor(config: str | None, sets: list[str], nproc: int, out: str | None, device: str,
               cfg=None) -> int:
    work = Path(out) if out else Path("runs") / "doctor"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    shrunk = shrink(cfg, nproc, device) if cfg is not None else None
    if shrunk is not None:
        print(f"[doctor] the config shrunk ({' '.join(shrunk.sets[:5])}); kept: "
              f"{', '.join(shrunk.features) or 'nothing special'}", flush=True)
        for note in shrunk.notes:
            print(f"[doctor] {note}", flush=True)
    base = (*FLAT, *(shrunk.sets if shrunk else ()))
    rungs = ladder(nproc, shrunk)
    by_name = {r.name: r for r in rungs}
    reference = None
    failed = None
    for rung in rungs:
        if rung.ascend_only and device != "Ascend":
            rung.status = "skipped"
            rung.detail = "needs Ascend" + (f" (the reference of {rung.needed_by})" if rung.needed_by else "")
            continue
        if rung.needs_procs and rung.needs_procs > nproc:
            rung.status = "skipped"
            rung.detail = f"needs {rung.needs_procs} devices (--nproc {nproc})"
            continue
        if failed:
            rung.status = "not run"
            continue
        t0 = time.monotonic()
        if rung.kernel:
            ok, log = _run_kernel_check(rung)
            rung.seconds = time.monotonic() - t0
            rung.status = "ok" if ok else "FAILED"
            if not ok:
                failed = (rung, log)
            continue
        ok, log = _run_rung(rung, config, [*base, *sets], work, by_name)
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
    cmd += ["--set", *sets, *rung.sets, f"run.dir={run_dir}"]
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
    """`train doctor`: cfg is the loaded config (its device picks the rungs; the rest is shrunk)."""
    return run_doctor(config, sets, nproc, out or str(Path(cfg.run.dir) / "doctor"), cfg.device, cfg)


# ---------------------------------------------------------------- the document-mask kernel rung

# bf16 keeps 8 significant bits: u = 2**-8. Both paths take the same bf16 q, k, v; the fused kernel
# accumulates in fp32 and rounds its output once (u/2); the plain path rounds the scores, the
# probabilities and the output (3 x u/2), each a relative error of a convex combination of v rows, so
# |difference| <= 4 * u/2 * max|v| + the fp32 softmax (negligible) = 2u * max|v| = 7.8e-3 * max|v|.
# Attending across a document boundary moves an output by a different document's v rows: O(max|v|).
KERNEL_TOLERANCE = 2 * 2.0 ** -8


def kernel_check() -> str:
    """One device (Ascend): the TND flash-attention kernel on fixed bf16 tensors against plain attention
    with the block-causal mask of the same packed documents. Returns "" or what differs."""
    import mindspore as ms
    import numpy as np
    from mindspore import Tensor
    from mindspore.common import dtype as mstype

    from mspretrain.train.model import Llama, ModelArgs

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("Ascend")
    base = dict(vocab_size=64, seq_length=64, hidden_size=128, num_layers=1, num_heads=8, eos_id=2,
                document_mask=True, reset_position_ids=False)
    fused = Llama(ModelArgs(**base, flash_attention=True), seed=0)
    plain = Llama(ModelArgs(**base), seed=0)
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 64, size=(2, 64)).astype(np.int32)
    tokens[0, [9, 30, 31]] = 2
    tokens[1, [40]] = 2
    q, k, v = (Tensor(rng.standard_normal((2, 8, 64, 16)).astype(np.float32)).astype(mstype.bfloat16)
               for _ in range(3))
    ends = fused.documents(Tensor(tokens))[0]
    mask = plain.documents(Tensor(tokens))[0]
    a = fused.layers[0].attention.varlen_attention(q, k, v, ends).astype(mstype.float32).asnumpy()
    b = plain.layers[0].attention.plain_attention(q, k, v, mask)
    b = b.transpose(0, 2, 1, 3).reshape(2, 64, 128).astype(mstype.float32).asnumpy()
    bound = KERNEL_TOLERANCE * float(np.abs(v.astype(mstype.float32).asnumpy()).max())
    worst = float(np.abs(a - b).max())
    return "" if worst <= bound else f"fused TND output differs from masked plain attention by {worst:.3e} > {bound:.3e}"


def _run_kernel_check(rung: Rung) -> tuple[bool, str]:
    code = "import sys; from mspretrain.train.doctor import kernel_check; r = kernel_check(); print(r); sys.exit(1 if r else 0)"
    print(f"[doctor] {rung.name}: the TND kernel against masked plain attention on fixed tensors", flush=True)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode == 0:
        rung.detail = f"within {KERNEL_TOLERANCE:.1e} x max|v|"
        return True, ""
    rung.detail = (proc.stdout.strip().splitlines() or [f"exited {proc.returncode}"])[-1]
    return False, "\n".join((proc.stdout + proc.stderr).splitlines()[-TAIL_LINES:])
