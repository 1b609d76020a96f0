"""`train doctor`: the first command to run on a new cluster, on the user's own config.

The config is shrunk (`shrink`: width, depth, batch, keeping every divisibility rule) and keeps its
parallel layout, precision, recompute, accumulation, sequence parallel, vocabulary split, optimizer
sharding and document masking. It then climbs a ladder of three-step runs, each a real `train launch`
on the dataset of the config:

  one device          the reference (every other rung is compared with it, same global batch); its
                      micro-batches accumulate in the graph loop (train.accumulate=loop), as do all
                      one-device rungs: the split mode's buffers are filled only by an AutoParallel compile
  dp=N                N processes under msrun, data parallel
  accumulation K=2 on 1  with accumulation kept: one device, 2 micro-batches in the device's own mode
                      (split on Ascend), against the reference
  mp=2                model parallel (Ascend)
  dp+opt-shard        data parallel with optimizer sharding (Ascend)
  pp=2                two pipeline stages, 2 micro-batches (Ascend)
  pp=2 dp=2           the same with two data-parallel replicas of each stage (Ascend, 4 devices)
  1 device, no mask   a second reference with the three document features off (Ascend: only the next
                      rung needs it)
  bf16+flash          bf16 with the fused flash-attention kernel, BNSD layout, no document mask
                      (Ascend), compared with "1 device, no mask"
  bf16+flash+docmask  bf16 with the kernel in TND layout over each sample's documents (Ascend)
  your layout         the config's own dp x mp x pp and precision (when it is not one fp32 device)
  docmask kernel      the fused TND kernel against masked plain attention on fixed tensors (Ascend)
  fused kernels       with model.fused_kernels: each fused kernel (RmsNorm, RotaryPositionEmbedding,
                      Swiglu) against the composed layer, fp32 forward and backward (Ascend)
  resume+eval         the dp=N rung again from its step-2 checkpoint, then step 3 and a validation:
                      loss, grad norm, val loss and every rank's state bit for bit equal to the dp=N rung's
  resume sharded      the same on the optimizer-sharded layout (Ascend): compile, then load each rank's
                      slices of the dp+opt-shard rung's step-2 checkpoint
  resume mp=2         the same on the mp=2 rung's layout (Ascend)
  resume pp=2         the same on the pp=2 rung's layout (Ascend)
  resume dp=N on 1    the dp=N rung's step-2 checkpoint resumed on another layout (one device): step 3
                      and the validation within TOLERANCE of the dp=N rung's (reduction order only; the
                      same samples, the same weights and moments)
  resume mp=2 as dp   the mp=2 rung's step-2 checkpoint, its slices merged and resumed data parallel
                      (Ascend: `train/checkpoint/reshard.py`), likewise against the mp=2 rung

Each rung must finish, report a non-zero first grad norm (0: no gradient reached the update), step
losses and gradient norms within TOLERANCE (relative) of the reference's (bf16 within BF16_TOLERANCE), and leave bitwise-equal state digests on every rank of
each replica group (`replica_groups`: which ranks hold the same tensors, derived from the layout).
The pp rung's val loss comes from its step-3 checkpoint merged into full tensors and validated on one
device (validation does not run through pipeline stages), compared with the reference's. Each
rung that ran shows its measured peak memory beside `train estimate`'s figure for the same shrunk
config. Rungs the device cannot run (CPU: mp, optimizer sharding, pp, bf16) are listed as skipped. An
Ascend config on a machine whose MindSpore cannot use Ascend runs its CPU rungs with device=CPU, said in
one line with the other replacements. It prints a table; at the first failure it prints the failing
worker's log tail and exits 1.

The per-rank records come from this module's train.hooks callbacks (TRAIN_HOOKS=train.doctor,
DOCTOR_TRACE_DIR=DIR): after each step every rank appends {call, loss, grad_norm, state digests by
tensor class}.
"""
from __future__ import annotations

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
# one-device references accumulate in the graph loop: the split mode's `accu_grads` are filled only by the
# AutoParallel compile, which one device does not run (the "accumulation K=2 on 1" rung checks that path)
LOOP = ("train.accumulate=loop",)


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
    parallel: tuple = (1, 1, 1, False)     # the config's (dp, mp, pp, optimizer sharding)
    batch: int = 0                          # the shrunk global batch
    fused: tuple = ()                       # the config's model.fused_kernels (its "fused kernels" rung)


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
    # divisible by every rung's dp x micro-batches (4 x nproc), and by the config's own layout's where
    # its rung can run here (a 64-device layout's 256 rows would ask a small valid split for 256)
    own = p.data_parallel * (p.micro_batch_num if pp > 1 else 1) * (2 if accumulation else 1)
    batch = math.lcm(4 * nproc, own if p.data_parallel * mp * pp <= nproc else 1)
    sets = [f"model.hidden_size={16 * heads}", f"model.num_layers={layers}", f"model.num_heads={heads}",
            f"model.num_kv_heads={kv}", f"model.ffn_size={64 * mp}", "model.max_documents=8",
            f"train.global_batch_size={batch}", *RUN,
            # every rung validates the same rows: the default eval batch follows each layout's rows per
            # forward (micro-batch x dp), so val losses of two layouts would read different samples
            f"eval.batch_size={batch}"]
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
    fused = tuple(m.fused_kernels)
    if fused:
        features.append(f"fused kernels ({', '.join(fused)})")
        if device != "Ascend":
            sets.append("model.fused_kernels=[]")
            notes.append(f"model.fused_kernels [{', '.join(fused)}] replaced by the composed layers: MindSpore "
                         f"2.10's RmsNorm, RotaryPositionEmbedding and Swiglu have no CPU kernels")
    # communication switches need the config's own ranks: every rung starts without them, the config's
    # "your layout" rung (Ascend) runs them
    comm = _communication_switches(cfg)
    sets += ["parallel.comm_fusion=0", "parallel.comm_fusion_allgather=0", "parallel.comm_fusion_reducescatter=0",
             "parallel.overlap=[]", "recompute.mp_comm=true"]
    if comm:
        features.append("communication switches")
        if device != "Ascend":
            notes.append(f"{', '.join(comm)} dropped: communication switches of Ascend's semi-auto parallel")
    layout = [f"parallel.data_parallel={p.data_parallel}", f"parallel.model_parallel={mp}",
              f"parallel.pipeline_stage={pp}", f"parallel.micro_batch_num={p.micro_batch_num}",
              f"parallel.optimizer_shard={str(p.optimizer_shard).lower()}",
              f"parallel.sequence_parallel={str(p.sequence_parallel).lower()}",
              f"parallel.vocab_emb_dp={str(p.vocab_emb_dp).lower()}", f"precision.dtype={precision}"]
    if device == "Ascend":
        layout += comm
    if pp > 1:
        layout.append("eval.every_steps=0")        # no in-loop validation through stages
    for name, on in (("model parallel", mp > 1), ("pipeline", pp > 1), ("optimizer sharding", p.optimizer_shard),
                     ("sequence parallel", p.sequence_parallel), ("vocabulary split", not p.vocab_emb_dp)):
        if on:
            features.append(name)
    return Shrunk(tuple(sets), tuple(features), tuple(notes), tuple(layout),
                  p.data_parallel * mp * pp, precision, bool(m.document_mask), bool(m.flash_attention),
                  accumulation, (p.data_parallel, mp, pp, bool(p.optimizer_shard)), batch, fused)


def _communication_switches(cfg) -> list:
    """The config's communication switches that differ from the defaults, as --set items."""
    p, out = cfg.parallel, []
    for key in ("comm_fusion", "comm_fusion_allgather", "comm_fusion_reducescatter"):
        if getattr(p, key):
            out.append(f"parallel.{key}={getattr(p, key)}")
    if p.overlap:
        out.append(f"parallel.overlap=[{', '.join(p.overlap)}]")
    if not cfg.recompute.mp_comm:
        out.append("recompute.mp_comm=false")
    return out


# ---------------------------------------------------------------- which ranks hold the same tensors

# A rank's state tensors fall in three classes by how the compiled layout (Cell.parameter_layout_dict,
# [dev_matrix, tensor_map, slice_shape, field_size, uniform_split, opt_shard_group, full_shape, ...])
# stores them on that rank:
#   whole  the tensor whole (tensor map all -1, no optimizer shard group): norms, scalars, every tensor
#          without a layout (one device, CPU data parallel)
#   mp     a model-parallel slice (some tensor-map entry != -1): the plan splits weights only along the
#          model-parallel axis, so ranks at the same model-parallel position hold the same slice
#   opt    an optimizer-sharded slice (opt_shard_group set; optimizer_level level1 keeps weights and
#          moments sliced, the whole weight exists only inside the graph after its all-gather): the
#          shard group is the parameter's whole replica group, so each rank holds a slice no other has
DIGEST_CLASSES = ("whole", "mp", "opt")
_MOMENT_PREFIXES = ("adam_m.", "adam_v.")


def replica_groups(dp: int, mp: int, pp: int, opt_shard: bool) -> dict[str, tuple]:
    """class -> the groups of ranks whose tensors of that class must be bitwise equal, for the device
    matrix rank = stage * dp * mp + dp_rank * mp + mp_rank (train.parallel.distributed). Pipeline stages hold
    different layers, so no group crosses a stage. Groups of one rank compare nothing."""
    def rank(stage, d, m):
        return stage * dp * mp + d * mp + m
    stages = range(pp)
    whole = tuple(tuple(rank(s, d, m) for d in range(dp) for m in range(mp)) for s in stages)
    sliced = tuple(tuple(rank(s, d, m) for d in range(dp)) for s in stages for m in range(mp))
    alone = tuple((r,) for r in range(dp * mp * pp))
    return {"whole": whole, "mp": sliced, "opt": alone if opt_shard else sliced}


def tensor_class(layout) -> str:
    """whole | mp | opt of one parameter's compiled layout (None or empty: whole)."""
    if not layout:
        return "whole"
    if len(layout) > 5 and layout[5]:
        return "opt"
    return "mp" if any(int(t) != -1 for t in layout[1]) else "whole"


def state_digests(params: dict, layouts: dict | None = None) -> dict[str, str]:
    """class -> sha256 over this rank's tensors of that class (name and bytes, names sorted). An AdamW
    moment without a layout of its own takes its weight's (the moments are sliced like the weight)."""
    import hashlib

    layouts = layouts or {}
    digests: dict = {}
    for name in sorted(params):
        layout = layouts.get(name)
        if layout is None and name.startswith(_MOMENT_PREFIXES):
            layout = layouts.get(name.split(".", 1)[1])
        h = digests.setdefault(tensor_class(layout), hashlib.sha256())
        h.update(name.encode())
        h.update(params[name].asnumpy().tobytes())
    return {k: h.hexdigest() for k, h in sorted(digests.items())}


def compare_digests(ranks: dict[int, list[dict]], groups: dict[str, tuple]) -> str:
    """"" when every group holds equal digests of its class after every step call; else what differs."""
    calls = min(len(recs) for recs in ranks.values())
    for call in range(calls):
        for cls, class_groups in groups.items():
            for group in class_groups:
                if len(group) < 2:
                    continue
                seen = {r: ranks[r][call]["state"].get(cls) for r in group if r in ranks}
                if len(set(seen.values())) > 1:
                    return (f"state digests of the {cls!r} tensors differ within replica group {list(group)} "
                            f"after step call {call + 1}: " + ", ".join(f"rank {r} {d and d[:12]}"
                                                                       for r, d in seen.items()))
    return ""


def describe_groups(groups: dict[str, tuple], present=DIGEST_CLASSES) -> str:
    """The comparisons a layout makes for the classes `present`, short: "whole 1x4, mp 2x2" (groups x
    ranks per group)."""
    parts = []
    for cls in DIGEST_CLASSES:
        compared = [g for g in groups.get(cls, ()) if len(g) > 1 and cls in present]
        if compared:
            parts.append(f"{cls} {len(compared)}x{len(compared[0])}")
    return ", ".join(parts) or "nothing (no replicas)"


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
        # the compiled step's layouts (AutoParallel, Ascend); {} on one device and CPU data parallel
        layouts = getattr(self._step.cell, "parameter_layout_dict", None) or {}
        digests = state_digests(self._step.state_parameters(), layouts)
        with open(self._path, "a") as f:
            f.write(json.dumps({"call": self._calls, "loss": result.loss, "grad_norm": result.grad_norm,
                                "state": digests}) + "\n")
        return result


# ---------------------------------------------------------------- the ladder

@dataclass
class Rung:
    name: str
    nproc: int
    sets: tuple
    ascend_only: bool = False
    tolerance: float = TOLERANCE
    parallel: tuple = (1, 1, 1, False)  # (dp, mp, pp, optimizer sharding): its replica groups
    resume_of: str | None = None      # rerun of that rung from its step-(STEPS - 1) checkpoint
    relayout: bool = False            # resumed on another layout than resume_of's: within tolerance
    merged_val: bool = False          # val loss from its step-STEPS checkpoint merged, on one device (pp)
    reference: str | None = None      # the rung it is compared with (None: the first one)
    is_reference: bool = False        # a reference itself: compared with nothing
    needed_by: str = ""               # why it runs (a reference only some rung needs)
    why: str = ""                     # what it checks that needs Ascend (shown when skipped)
    needs_procs: int = 0              # devices it needs (the config's own layout), 0: nproc
    kernel: bool = False              # the one-device kernel check, not a training run
    check: str = "docmask"            # which kernel check: docmask (kernel_check) | fused (models/fused.py)
    status: str = "not run"
    detail: str = ""
    losses: list = field(default_factory=list)
    norms: list = field(default_factory=list)
    seconds: float = 0.0
    val_loss: float | None = None
    peak_mb: float | None = None      # measured: rank 0's peak_memory_mb over its steps
    estimate_mb: float | None = None  # `train estimate` for the same shrunk config
    compared: str = ""                # the replica groups whose digests were compared


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
                        parallel=shrunk.parallel, needs_procs=shrunk.world,
                        merged_val=shrunk.parallel[2] > 1))     # pipeline stages: no in-loop validation
    kernel = ([Rung("docmask kernel", 1, (), ascend_only=True, kernel=True)]
              if shrunk is None or (shrunk.docs and shrunk.flash) else [])
    if shrunk is not None and shrunk.fused:     # the config's fused kernels against the composed layers
        kernel.append(Rung("fused kernels", 1, (), ascend_only=True, kernel=True, check="fused",
                           why="RmsNorm, RotaryPositionEmbedding, Swiglu: Ascend kernels"))
    dp = (nproc, 1, 1, False)
    opt_shard = f"dp={nproc}+opt-shard"
    mp2 = (f"parallel.data_parallel={half}", "parallel.model_parallel=2", *FP32)
    pp2 = ("parallel.pipeline_stage=2", "parallel.micro_batch_num=2", "train.micro_batch_size=0",
           "eval.every_steps=0", *FP32)
    return [
        Rung("one device", 1, ("parallel.data_parallel=1", *LOOP, *FP32)),
        Rung(f"dp={nproc}", nproc, (f"parallel.data_parallel={nproc}", *FP32), parallel=dp),
        *accumulation_rungs(shrunk),
        Rung("mp=2", 2 * half, mp2, ascend_only=True, parallel=(half, 2, 1, False)),
        Rung(opt_shard, nproc, (f"parallel.data_parallel={nproc}", "parallel.optimizer_shard=true", *FP32),
             ascend_only=True, parallel=(nproc, 1, 1, True)),
        # no validation through the stages: its step-3 checkpoint merged, validated on one device
        Rung("pp=2 m=2", 2, ("parallel.data_parallel=1", *pp2), ascend_only=True, parallel=(1, 1, 2, False),
             merged_val=True, why="val loss: step-3 checkpoint merged, on one device; none through stages"),
        Rung("pp=2 dp=2", 4, ("parallel.data_parallel=2", *pp2), ascend_only=True, parallel=(2, 1, 2, False),
             merged_val=True, needs_procs=4, why="pipeline stages with data-parallel replicas of each stage"),
        Rung("1 device, no mask", 1, ("parallel.data_parallel=1", *DOCUMENTS_OFF, *LOOP, *FP32), ascend_only=True,
             is_reference=True, needed_by="bf16+flash"),
        Rung("bf16+flash", nproc, (f"parallel.data_parallel={nproc}", "precision.dtype=bf16",
                                   "model.flash_attention=true", *DOCUMENTS_OFF), ascend_only=True,
             tolerance=BF16_TOLERANCE, reference="1 device, no mask", parallel=dp),
        Rung("bf16+flash+docmask", nproc, (f"parallel.data_parallel={nproc}", "precision.dtype=bf16",
                                           "model.flash_attention=true", *DOCUMENTS_ON), ascend_only=True,
             tolerance=BF16_TOLERANCE, parallel=dp),
        *own,
        *kernel,
        Rung("resume+eval", nproc, (f"parallel.data_parallel={nproc}", *FP32), resume_of=f"dp={nproc}",
             parallel=dp),
        # compile, then load each rank's slices (semi-auto parallel: Ascend only), on the layout that wrote them
        Rung("resume sharded", nproc, (f"parallel.data_parallel={nproc}", "parallel.optimizer_shard=true", *FP32),
             ascend_only=True, resume_of=opt_shard, parallel=(nproc, 1, 1, True),
             why="compile, then load sliced tensors: semi-auto parallel"),
        Rung("resume mp=2", 2 * half, mp2, ascend_only=True, resume_of="mp=2", parallel=(half, 2, 1, False),
             why="compile, then load model-parallel slices, the same layout"),
        Rung("resume pp=2", 2, ("parallel.data_parallel=1", *pp2), ascend_only=True, resume_of="pp=2 m=2",
             parallel=(1, 1, 2, False), why="compile, then load each stage's tensors, the same layout"),
        # another layout at --resume: the data-parallel change runs anywhere, the resharding of
        # model-parallel slices only where they exist
        Rung(f"resume dp={nproc} on 1", 1, ("parallel.data_parallel=1", *LOOP, *FP32), resume_of=f"dp={nproc}",
             relayout=True),
        Rung("resume mp=2 as dp", nproc, (f"parallel.data_parallel={nproc}", *FP32), ascend_only=True,
             resume_of="mp=2", relayout=True, parallel=dp,
             why="mp slices merged and split again at --resume (train/checkpoint/reshard.py)"),
    ]


def accumulation_rungs(shrunk: Shrunk | None) -> list[Rung]:
    """With accumulation kept: one device, K = 2 micro-batches in the device's own mode (train.accumulate
    as configured: split on Ascend), against the one-device reference's loop over K = 2 x nproc."""
    if shrunk is None or not shrunk.accumulation:
        return []
    return [Rung("accumulation K=2 on 1", 1, ("parallel.data_parallel=1",
                                               f"train.micro_batch_size={shrunk.batch // 2}", *FP32))]


def run_doctor(config: str | None, sets: list[str], nproc: int, out: str | None, device: str,
               cfg=None, missing: str = "") -> int:
    """The ladder on `device`; `missing`: why the config's Ascend is not usable here (its CPU rungs run,
    said in one line with what the CPU replaces)."""
    work = Path(out) if out else Path("runs") / "doctor"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    shrunk = shrink(cfg, nproc, device) if cfg is not None else None
    if shrunk is not None:
        print(f"[doctor] the config shrunk ({' '.join(shrunk.sets[:5])}); kept: "
              f"{', '.join(shrunk.features) or 'nothing special'}", flush=True)
        if not missing:
            for note in shrunk.notes:
                print(f"[doctor] {note}", flush=True)
    if missing:
        replaced = ", ".join(("device=CPU", *(shrunk.notes if shrunk else ())))
        print(f"[doctor] Ascend is not usable here ({missing}): running the CPU rungs with {replaced}; "
              f"the Ascend rungs are listed as skipped (needs Ascend)", flush=True)
    base = (*FLAT, *(shrunk.sets if shrunk else ()))
    rungs = ladder(nproc, shrunk)
    by_name = {r.name: r for r in rungs}
    reference = None
    failed = None
    for rung in rungs:
        if rung.ascend_only and device != "Ascend":
            rung.status = "skipped"
            rung.detail = "needs Ascend" + (f" (the reference of {rung.needed_by})" if rung.needed_by else "") + (
                f" ({rung.why})" if rung.why else "")
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
            _memory(rung, config, [*base, *sets], work)
            ok = _check(rung, work, by_name[rung.reference] if rung.reference else reference, by_name)
        if ok and rung.merged_val:
            ok, log = _check_merged_val(rung, config, [*base, *sets], work, reference)
        if not ok:
            rung.status = "FAILED"
            failed = (rung, log)
            continue
        rung.status = "ok"
        if reference is None:
            reference = rung
    print(format_table(rungs, reference))
    print(memory_note(device))
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
    from mspretrain.train.observe.metrics import read_records

    return read_records(run_dir / "metrics.jsonl")


def _check(rung: Rung, work: Path, reference: Rung | None, by_name) -> bool:
    run_dir = _run_dir(work, rung)
    steps = [r for r in _metrics(run_dir) if not r.get("eval")]
    rung.losses = [r["loss"] for r in steps]
    rung.norms = [r["grad_norm"] for r in steps]
    if steps and not steps[0]["grad_norm"]:
        rung.detail = zero_norm_detail(rung, steps[0]["step"],
                                       by_name.get(rung.resume_of) if rung.resume_of else reference)
        return False
    ranks = _records(run_dir)
    if len(ranks) != rung.nproc or not all(ranks.values()):
        rung.detail = f"{len(ranks)} of {rung.nproc} ranks recorded steps"
        return False
    groups = replica_groups(*rung.parallel)
    if differs := compare_digests(ranks, groups):
        rung.detail = differs
        return False
    rung.compared = describe_groups(groups, {c for recs in ranks.values() for rec in recs for c in rec["state"]})
    evals = [r for r in _metrics(run_dir) if r.get("eval")]
    rung.val_loss = evals[-1]["val_loss"] if evals else None
    if rung.resume_of and rung.relayout:
        return _check_relayout(rung, run_dir, by_name[rung.resume_of], work)
    if rung.resume_of:
        source = by_name[rung.resume_of]
        mine = [r for r in _metrics(run_dir)]
        theirs = [r for r in _metrics(_run_dir(work, source)) if r["step"] >= STEPS]
        keys = ("step", "loss", "grad_norm", "val_loss")
        if [[r.get(k) for k in keys] for r in mine] != [[r.get(k) for k in keys] for r in theirs]:
            rung.detail = f"resumed step {STEPS} and eval differ from {source.name!r}: {mine} vs {theirs}"
            return False
        theirs = _records(_run_dir(work, source))
        for r in sorted(ranks):         # the same layout: each rank holds the same slices as there
            if ranks[r][-1]["state"] != theirs.get(r, [{}])[-1].get("state"):
                rung.detail = f"rank {r}'s state after the resumed step {STEPS} differs from {source.name!r}"
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


def zero_norm_detail(rung: Rung, step: int, reference: Rung | None) -> str:
    """Why a rung whose first step's grad norm is 0 fails: no gradient reached the update (e.g.
    accumulation buffers nothing filled), so its loss can match a reference while nothing trains."""
    what = f"rung {rung.name!r}: step {step} grad norm is 0 (no gradient reached the update"
    if reference is None or rung.is_reference or reference is rung:
        return what + "); it is the reference of the rungs after it, which cannot be compared with it"
    ref = f"{reference.norms[0]!r}" if reference.norms else "none"
    return what + f"; its reference {reference.name!r} has {ref} at its first step)"


def _check_relayout(rung: Rung, run_dir: Path, source: Rung, work: Path) -> bool:
    """A rung resumed on another layout from `source`'s step-(STEPS - 1) checkpoint: its step STEPS and
    validation within the rung's tolerance of the source's (another layout sums in another order; a
    sample skipped or repeated, or a moment lost, moves the loss far more)."""
    if source.status != "ok":
        rung.detail = f"its source {source.name!r} did not run ({source.status})"
        return False
    theirs = {(r["step"], bool(r.get("eval"))): r for r in _metrics(_run_dir(work, source))}
    mine = _metrics(run_dir)
    if [(r["step"], bool(r.get("eval"))) for r in mine] != [(STEPS, False), (STEPS, True)]:
        rung.detail = f"ran {[(r['step'], bool(r.get('eval'))) for r in mine]}, not step {STEPS} and its eval"
        return False
    for r in mine:
        ref = theirs.get((r["step"], bool(r.get("eval"))), {})
        for key in ("val_loss",) if r.get("eval") else ("loss", "grad_norm"):
            a, b = r.get(key), ref.get(key)
            if a is None or b is None or abs(a - b) > rung.tolerance * abs(b):
                rung.detail = (f"resumed step {STEPS} {key} {a!r} vs {source.name} {b!r}"
                               + (f": relative difference {abs(a - b) / abs(b):.2e} > {rung.tolerance:.0e}"
                                  if a is not None and b is not None else ""))
                return False
    return True


COLUMNS = (("rung", 21), ("procs", 5), ("status", 8), ("loss (steps 1-3)", 30), ("grad norm (steps 1-3)", 30),
           ("max rel diff", 12), ("peak MiB", 9), ("est MiB", 8), ("peak/est", 8), ("time", 6), ("note", 0))


def format_table(rungs: list[Rung], reference: Rung | None) -> str:
    """One row per rung, fixed-width columns (COLUMNS); the note last."""
    def line(cells) -> str:
        return " ".join(f"{c:<{w}}" if w else c for c, (_, w) in zip(cells, COLUMNS)).rstrip()

    head = line([name for name, _ in COLUMNS])
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
        peak = f"{r.peak_mb:.1f}" if r.peak_mb is not None else ""
        est = f"{r.estimate_mb:.1f}" if r.estimate_mb is not None else ""
        ratio = f"{r.peak_mb / r.estimate_mb:.2f}" if r.peak_mb is not None and r.estimate_mb else ""
        if r.status != "ok":
            note = r.detail
        elif r.kernel:
            note = r.detail
        elif r.resume_of and r.relayout:
            note = f"step {STEPS} + eval within tol {r.tolerance:.0e} of the {r.resume_of} rung (another layout)"
        elif r.resume_of:
            note = f"step {STEPS} + eval + every rank's state bitwise = {r.resume_of} rung"
        elif r is reference or r.is_reference:
            note = "reference"
        else:
            note = f"tol {r.tolerance:.0e}" + (f" vs {ref.name}" if r.reference else "")
        if r.status == "ok" and not r.kernel and r.compared and r.nproc > 1:
            note += f"; digests equal in groups: {r.compared}"
        if r.status == "ok" and r.merged_val:
            note += f"; {r.detail}"
        lines.append(line([r.name, str(r.nproc), r.status, losses, norms, diff, peak, est, ratio, secs, note]))
    return "\n".join(lines)


def memory_note(device: str) -> str:
    """What the peak column measures on `device`."""
    if device == "CPU":
        return ("memory: peak = rank 0's peak resident set (RSS); on CPU it includes the host runtime (MindSpore "
                "itself, ~400 MiB, the loader, the compiled graph keeping every intermediate), so peak/est, "
                "against `train estimate`'s device figure for the same shrunk config, is only indicative")
    return ("memory: peak = rank 0's MindSpore max allocated device memory, beside `train estimate`'s figure "
            "for the same shrunk config")


def _memory(rung: Rung, config, sets, work: Path) -> None:
    """rung.peak_mb from its metrics (rank 0), rung.estimate_mb: `train estimate` of its config."""
    peaks = [r["peak_memory_mb"] for r in _metrics(_run_dir(work, rung))
             if not r.get("eval") and r.get("peak_memory_mb") is not None]
    rung.peak_mb = max(peaks) if peaks else None
    try:
        from mspretrain.train.config import load_config
        from mspretrain.train.memory import dataset_shape, estimate

        cfg = load_config(config, [*sets, *rung.sets])
        rung.estimate_mb = estimate(cfg, *dataset_shape(cfg)).total / 2 ** 20
    except Exception as e:   # noqa: BLE001 (a figure beside the check: never the reason a rung fails)
        rung.estimate_mb = None
        print(f"[doctor] {rung.name}: no memory estimate ({type(e).__name__}: {e})", flush=True)


# ---------------------------------------------------------------- the pp rung's validation

def _check_merged_val(rung: Rung, config, sets, work: Path, reference: Rung | None) -> tuple[bool, str]:
    """Validation does not run through pipeline stages: the rung's step-STEPS checkpoint, merged
    into full tensors, is validated on one device with the reference's layout; its val loss must match
    the reference's within the rung's tolerance."""
    ckpt_dir = _run_dir(work, rung) / "checkpoints" / f"step_{STEPS:08d}"
    one_device = [*sets, "parallel.data_parallel=1", "parallel.model_parallel=1", "parallel.pipeline_stage=1",
                  "parallel.micro_batch_num=1", *FP32, f"run.dir={_run_dir(work, rung)}_merged"]
    code = ("import json, sys; from mspretrain.train.doctor import checkpoint_validation; "
            "print(repr(checkpoint_validation(*json.loads(sys.argv[1]))))")
    args = json.dumps([str(config) if config else None, one_device, str(ckpt_dir),
                       str(_run_dir(work, rung)) + "_merged"])
    print(f"[doctor] {rung.name}: val loss of its step-{STEPS} checkpoint, merged, on one device", flush=True)
    proc = subprocess.run([sys.executable, "-c", code, args], capture_output=True, text=True)
    log = "\n".join((proc.stdout + proc.stderr).splitlines()[-TAIL_LINES:])
    if proc.returncode != 0:
        rung.detail = f"merged-checkpoint validation exited {proc.returncode}"
        return False, log
    rung.val_loss = float(proc.stdout.strip().splitlines()[-1])
    return (True, "") if _judge_val(rung, reference) else (False, log)


def _judge_val(rung: Rung, reference: Rung | None) -> bool:
    """rung.val_loss (its merged checkpoint's) against the reference's, within the rung's tolerance."""
    ref = reference.val_loss if reference is not None else None
    if ref is None:
        rung.detail = f"val loss {rung.val_loss!r} (merged checkpoint): the reference has none"
        return False
    if abs(rung.val_loss - ref) > rung.tolerance * abs(ref):
        rung.detail = (f"val loss {rung.val_loss!r} (step-{STEPS} checkpoint merged, one device) vs "
                       f"{reference.name} {ref!r}: relative difference {abs(rung.val_loss - ref) / abs(ref):.2e} "
                       f"> {rung.tolerance:.0e}")
        return False
    rung.detail = f"val loss {rung.val_loss:.6f} (step-{STEPS} checkpoint merged, one device; none through stages)"
    return True


def checkpoint_validation(config: str | None, sets: list, ckpt_dir: str, out: str) -> float:
    """The val loss of a checkpoint on one device: a sharded one (rank_R/ and strategy/, Ascend) is first
    merged into full tensors with MindSpore's checkpoint transformation (docs/parallel.md); a full one
    (model.ckpt) is read as it is. `sets`: the one-device config."""
    import mindspore as ms

    from mspretrain.train import checkpoint as ckpt
    from mspretrain.train.config import load_config
    from mspretrain.train.eval.evaluate import validation_loss
    from mspretrain.train.step.loss import CausalLMLoss
    from mspretrain.train.memory import dataset_shape
    from mspretrain.train.models import spec as model_spec
    from mspretrain.train.checkpoint.reshard import merged_to_one_device
    from mspretrain.train.step.precision import apply_precision

    cfg = load_config(config, sets)
    source, out = Path(ckpt_dir), Path(out)
    source = merged_to_one_device(source, out / "merged")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device(cfg.device)
    seq, vocab = dataset_shape(cfg)
    from mspretrain.loader.manifest import load_manifest
    eos = load_manifest(cfg.data.path).tokenizer.eos_id
    family = model_spec.of(cfg)
    model = family.build_model(family.model_args(cfg.model, vocab, seq, cfg.device, cfg.precision.dtype, eos),
                               cfg.seed)
    loss_net = CausalLMLoss(apply_precision(model, cfg.precision), model.args.vocab_size,
                            eos if cfg.train.eod_mask_loss else -1)
    ckpt.load_params(source, {p.name: p for p in loss_net.get_parameters()}, allow_extra=True, verify=False)
    return validation_loss(loss_net, cfg, seq)


def main(cfg, config: str | None, sets: list[str], nproc: int, out: str | None) -> int:
    """`train doctor`: cfg is the loaded config (its device picks the rungs; the rest is shrunk). An
    Ascend config on a machine where MindSpore cannot use Ascend runs the CPU rungs with device=CPU."""
    device, sets, missing = cfg.device, list(sets), ""
    if device == "Ascend" and (missing := ascend_missing()):
        device, sets = "CPU", [*sets, "device=CPU"]
    return run_doctor(config, sets, nproc, out or str(Path(cfg.run.dir) / "doctor"), device, cfg,
                      missing=missing)


_PROBE = ("import mindspore as ms\n"
          "try:\n    ms.set_device('Ascend')\nexcept (RuntimeError, ValueError) as e:\n"
          "    print(str(e).strip().splitlines()[0][:120])")


def ascend_missing() -> str:
    """"" when this MindSpore can set device Ascend, else why not (one line). In a child process: the
    doctor's own process keeps no device context."""
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True)
    if proc.returncode != 0:
        return (proc.stderr.strip().splitlines() or [f"the probe exited {proc.returncode}"])[-1][:120]
    said = (proc.stdout.strip().splitlines() or [""])[-1]
    return ". ".join(said.split(". ")[:2])[:120]      # "Unsupported device target Ascend. This process ..."


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

    from mspretrain.train.models.llama.model import Llama, ModelArgs

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
    if rung.check == "fused":
        from mspretrain.train.models.fused_check import FUSED_TOLERANCE
        call = "from mspretrain.train.models.fused_check import compare_with_composed as check"
        what, within = "each fused kernel against the composed layer, fp32, forward and backward", (
            f"within {FUSED_TOLERANCE:.1e} x max|composed|")
    else:
        call = "from mspretrain.train.doctor import kernel_check as check"
        what, within = "the TND kernel against masked plain attention on fixed tensors", (
            f"within {KERNEL_TOLERANCE:.1e} x max|v|")
    code = f"import sys; {call}; r = check(); print(r); sys.exit(1 if r else 0)"
    print(f"[doctor] {rung.name}: {what}", flush=True)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode == 0:
        rung.detail = within
        return True, ""
    rung.detail = (proc.stdout.strip().splitlines() or [f"exited {proc.returncode}"])[-1]
    return False, "\n".join((proc.stdout + proc.stderr).splitlines()[-TAIL_LINES:])
