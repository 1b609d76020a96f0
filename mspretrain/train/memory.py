"""Per-device memory planner (`train estimate`): pure functions of the config, the sequence length and
the vocabulary.

Static memory per parameter: fp16/bf16 weights 2 + gradients 4 + fp32 master weights 4 + Adam m 4 +
v 4 = 18 bytes (the trainer differentiates with respect to the fp32 master weights, so the gradients
have the parameters' dtype, fp32; Megatron's 16-byte figure assumes 16-bit gradients); fp32 training:
weights 4 + gradients 4 + m 4 + v 4 = 16 bytes. Model parallel divides the projection weights (and the embedding when it is
split by vocabulary, and the LM head), pipeline parallel keeps one stage's layers, optimizer sharding
(AutoParallel.hsdp over the data-parallel ranks) divides the master weights and Adam states (level1),
plus gradients (level2), plus the compute weights (level3).

Our trainer (mspretrain/train/step/cell.py, one graph per optimizer step) adds, as separate lines: the fp32 gradient
accumulators when a step has K > 1 micro-batches (`accu_grads.*`, 4 bytes/parameter, sharded with the
gradients; none when K = 1), and the step's own buffers after backward (unscaled gradients, clipped
gradients, the zeros that reset the accumulators).

Two memory regimes (`reuses_memory`):
- Ascend/GPU: buffers are reused once their last reader ran. Activations are what backward keeps,
  counted tensor by tensor by the model family's terms (ModelSpec.memory_terms: for Llama
  mspretrain/train/models/llama/memory.py), with recompute, model and sequence parallel. A pipeline
  stage under 1F1B holds min(p - stage, m) micro-batches in flight; the last stage also holds the
  logits. The update runs in backward's freed memory.
- CPU (MindSpore 2.10, measured by bench/bench_memory.py): a graph keeps a buffer for every node
  output for its lifetime. So activations = every forward and backward intermediate of one
  micro-batch (the step's while-loop body exists once, whatever K), recompute saves nothing, and the
  update's buffers add to them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from mspretrain.train.step.batching import micro_batch, micro_batches
from mspretrain.train.config import ConfigError
from mspretrain.train.models import spec as model_spec
from mspretrain.train.models.spec import reuses_memory
from mspretrain.train.parallel.plan import stage_layers
from mspretrain.train.parallel.recompute import recompute_plan
from mspretrain.train.steptime import message_bytes

GB = 1e9
BUCKET_CAP = 256 * 2 ** 20          # fused gradient all-reduce bucket, capped (MindSpore comm fusion)


@dataclass(frozen=True)
class Bytes:
    """Bytes per parameter of each static buffer."""
    weights: int
    grads: int
    master: int
    adam: int                       # m + v

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.master + self.adam


def bytes_per_param(dtype: str) -> Bytes:
    if dtype == "fp32":
        return Bytes(weights=4, grads=4, master=0, adam=8)
    if dtype in ("fp16", "bf16"):
        return Bytes(weights=2, grads=4, master=4, adam=8)
    raise ConfigError(f"precision.dtype must be fp32, fp16 or bf16, got {dtype!r}")


@dataclass(frozen=True)
class Estimate:
    params_total: int
    params_device: int              # parameters on the worst device, after mp and pp
    stage: int                      # the pipeline stage of the worst device
    weights: float                  # bytes
    grads: float
    optimizer: float                # master weights + Adam m, v
    accumulators: float             # fp32 gradient sums over K > 1 micro-batches (4 bytes/parameter)
    step_temps: float               # the update's own buffers (see _step_temp_bytes)
    reuse: bool                     # memory reused within and across graphs (Ascend/GPU; not CPU)
    activations: float
    comm: float
    layer_activations: tuple        # bytes per layer of that stage (one micro-batch)
    head_activations: float         # logits + final norm on the last stage (0 elsewhere)
    micro_batch: int                # samples per micro-batch per rank
    in_flight: int                  # micro-batches this stage holds at peak
    seq_length: int
    document_activations: float = 0.0   # packed-document mask / kernel ends and rotary tables, per stage

    @property
    def static(self) -> float:
        return self.weights + self.grads + self.optimizer

    @property
    def trainer(self) -> float:
        """What our trainer holds beyond the static bytes and the activations: the accumulators, and
        the update's temporaries. With reuse the update runs in backward's freed gradients and
        activations, so only its excess counts; on CPU the graph keeps them all."""
        if self.reuse:
            return self.accumulators + max(0.0, self.step_temps - self.grads - self.activations)
        return self.accumulators + self.step_temps

    @property
    def total(self) -> float:
        return self.static + self.activations + self.trainer + self.comm


# ---------------------------------------------------------------- activations

# ---------------------------------------------------------------- the estimate

def estimate(cfg, seq_length: int, vocab_size: int) -> Estimate:
    """The per-device estimate of the worst pipeline stage."""
    if seq_length < 1 or vocab_size < 1:
        raise ConfigError(f"memory estimate needs the sequence length and vocabulary "
                          f"(got {seq_length}, {vocab_size}): set data.path or model.vocab_size")
    p = cfg.parallel
    stages = stage_layers(cfg.model.num_layers, p.pipeline_stage, p.stage_offsets)
    rplan = recompute_plan(cfg.recompute, cfg.model.num_layers)
    best = None
    for s, layers in enumerate(stages):
        est = _stage_estimate(cfg, seq_length, vocab_size, s, layers, rplan)
        if best is None or est.total > best.total:
            best = est
    return best


def _stage_estimate(cfg, seq: int, vocab: int, stage: int, layers: tuple, rplan: dict) -> Estimate:
    p, terms = cfg.parallel, model_spec.of(cfg).memory_terms
    per = bytes_per_param(cfg.precision.dtype)
    n = terms.stage_params(cfg, vocab, stage, len(layers))
    dp = p.data_parallel
    level = p.optimizer_level if p.optimizer_shard else None
    shard = {"weights": level == "level3", "grads": level in ("level2", "level3"), "states": level is not None}
    weights = n * per.weights / (dp if shard["weights"] else 1)
    grads = n * per.grads / (dp if shard["grads"] else 1)
    optimizer = n * (per.master + per.adam) / (dp if shard["states"] else 1)
    accumulators = n * 4 / (dp if shard["grads"] else 1) if micro_batches(cfg) > 1 else 0.0
    step_temps = n * _step_temp_bytes(cfg) / (dp if shard["grads"] else 1)
    mb = micro_batch(cfg)
    m = p.micro_batch_num if p.pipeline_stage > 1 else 1
    in_flight = min(p.pipeline_stage - stage, m)
    per_layer = tuple(terms.layer_activation_bytes(cfg, seq, mb, rplan.get(i, ())) for i in layers)
    last = stage == p.pipeline_stage - 1
    head = terms.head_activation_bytes(cfg, seq, mb, vocab) if last else 0.0
    documents = terms.document_activation_bytes(cfg, seq, mb)
    activations = (sum(per_layer) + documents) * in_flight + head
    return Estimate(params_total=terms.count_params(cfg, vocab), params_device=int(n), stage=stage,
                    weights=weights, grads=grads, optimizer=optimizer, accumulators=accumulators,
                    step_temps=step_temps, reuse=reuses_memory(cfg), activations=activations,
                    comm=_comm_bytes(cfg, n, seq, mb), layer_activations=per_layer,
                    head_activations=head, micro_batch=mb, in_flight=in_flight, seq_length=seq,
                    document_activations=documents)


def _step_temp_bytes(cfg) -> int:
    """Bytes per parameter of the update's own buffers (mspretrain/train/step/cell.py): the unscaled fp32 gradients are
    all live when the global norm is known (clipping needs it), the clipped ones replace them one by
    one, the zeros that reset the accumulators are transient: 4. On CPU every one of them is kept:
    unscaled 4 + clipped 4 (when clip_norm > 0) + zeros 4 (only with accumulators)."""
    if reuses_memory(cfg):
        return 4
    return 4 + (4 if cfg.optim.clip_norm > 0 else 0) + (4 if micro_batches(cfg) > 1 else 0)


def _comm_bytes(cfg, n: float, seq: int, micro: int) -> float:
    p = cfg.parallel
    b = 4 if cfg.precision.dtype == "fp32" else 2
    act = message_bytes(cfg, seq, micro)
    comm = 0.0
    if p.data_parallel > 1:
        comm += min(n * 4, BUCKET_CAP)              # fp32 gradient all-reduce bucket
    if p.model_parallel > 1:
        comm += 2 * act                              # activation all-reduce / all-gather in + out
    if p.pipeline_stage > 1:
        comm += 2 * act                              # send + receive of a micro-batch boundary
    if p.optimizer_shard and p.data_parallel > 1:
        largest = model_spec.of(cfg).memory_terms.largest_weight(cfg)
        comm += 2 * largest / p.model_parallel * b   # the largest weight, gathered
    return comm


# ---------------------------------------------------------------- advice

@dataclass(frozen=True)
class Advice:
    change: str                     # the --set overrides, cumulative
    estimate: Estimate
    fits: bool


def _with(cfg, **sections):
    """A copy of cfg with some fields of some sections replaced: _with(cfg, parallel={...})."""
    out = cfg
    for section, fields in sections.items():
        out = replace(out, **{section: replace(getattr(out, section), **fields)})
    return out


def advise(cfg, seq_length: int, vocab_size: int, device_bytes: float) -> list[Advice]:
    """When cfg does not fit, the changes to try in order of cost, each on top of the previous, until
    one fits: select recompute (attention), full recompute, optimizer sharding (level1..3), then
    doubling model parallel, then pipeline stages, each taken from data parallel (same world size).
    Changes that are impossible for this config (e.g. sharding with dp 1) or that save nothing on top
    of the previous ones are skipped."""
    if estimate(cfg, seq_length, vocab_size).total <= device_bytes:
        return []
    out: list[Advice] = []
    cur, best = cfg, estimate(cfg, seq_length, vocab_size).total
    for change, step in _candidates(cfg):
        nxt = step(cur)
        if nxt is None or not _valid(nxt):
            continue
        est = estimate(nxt, seq_length, vocab_size)
        if est.total >= best:
            continue                    # no gain on top of the changes so far: not worth its cost
        cur, best = nxt, est.total
        fits = est.total <= device_bytes
        sets = " ".join(f"--set {s}" for s in diff_sets(cfg, cur))
        out.append(Advice(f"{change}: {sets}", est, fits))
        if fits:
            break
    return out


def _candidates(cfg):
    layers = f"0-{cfg.model.num_layers - 1}"
    yield "select recompute (attention)", lambda c: _with(
        c, recompute={"mode": "select", "select": {"attention": layers}, "full_layers": ""})
    yield "full recompute", lambda c: _with(c, recompute={"mode": "full", "select": {}, "full_layers": ""})
    for level in ("level1", "level2", "level3"):
        yield f"optimizer sharding {level}", lambda c, lv=level: (
            None if c.parallel.data_parallel == 1
            else _with(c, parallel={"optimizer_shard": True, "optimizer_level": lv}))
    for _ in range(6):
        yield "double model parallel", lambda c: _take_from_dp(c, "model_parallel")
    for _ in range(6):
        yield "double pipeline stages", lambda c: _take_from_dp(c, "pipeline_stage")


def _take_from_dp(cfg, key: str):
    p = cfg.parallel
    if p.data_parallel % 2:
        return None
    fields = {key: getattr(p, key) * 2, "data_parallel": p.data_parallel // 2}
    if key == "pipeline_stage":
        fields.update(micro_batch_num=max(p.micro_batch_num, fields[key]), stage_offsets=[])
    if fields["data_parallel"] == 1:
        fields["optimizer_shard"] = False
    return _with(cfg, parallel=fields)


def _valid(cfg) -> bool:
    from mspretrain.train.parallel.plan import validate

    p = cfg.parallel
    try:
        validate(replace(cfg, device="Ascend"), p.data_parallel * p.model_parallel * p.pipeline_stage)
    except ConfigError:
        return False
    return True


def diff_sets(old, new) -> list[str]:
    """`section.key=value` for every field of `new` that differs from `old` (the --set to type)."""
    out = []
    for section in ("recompute", "parallel", "train"):
        a, b = getattr(old, section), getattr(new, section)
        for name in a.__dataclass_fields__:
            va, vb = getattr(a, name), getattr(b, name)
            if va != vb:
                out.append(f"{section}.{name}={_yaml(vb)}")
    return out


def _yaml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: '{v}'" for k, v in value.items()) + "}"
    if value == "":
        return "''"
    return str(value)


# ---------------------------------------------------------------- printing (`train estimate`)

def parse_size(text: str) -> float:
    """'64GB' -> 64e9 bytes, '80GiB' -> 80 * 2**30, '512MB', a plain number = bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(i?)B?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ConfigError(f"--device-memory {text!r}: expected a size like 64GB or 80GiB")
    number, unit, binary = float(m.group(1)), m.group(2).upper(), m.group(3)
    power = "KMGT".index(unit) + 1 if unit else 0
    return number * (1024 if binary else 1000) ** power


def _gb(x: float) -> str:
    return f"{x / GB:8.2f} GB" if x >= 0.1 * GB or x == 0 else f"{x / 1e6:8.2f} MB"


def _count(n: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3f} {unit}"
    return f"{n:.0f}"


def _size(x: float) -> str:
    return f"{x / GB:.2f} GB" if x >= GB else f"{x / 1e6:.1f} MB"


def format_estimate(cfg, est: Estimate, device_bytes: float | None = None, margin: float = 0.0) -> str:
    """The breakdown; with `device_bytes`, the verdict against the device less `margin` bytes."""
    p = cfg.parallel
    per = bytes_per_param(cfg.precision.dtype)
    shard = f"optimizer sharding {p.optimizer_level}" if p.optimizer_shard else "no optimizer sharding"
    lines = [
        f"model: {_count(est.params_total)} parameters; {cfg.precision.dtype}: {per.total} bytes/parameter "
        f"(weights {per.weights} + gradients {per.grads} + fp32 master {per.master} + Adam m {per.adam // 2} "
        f"+ v {per.adam // 2})",
        f"parallel: dp {p.data_parallel} x mp {p.model_parallel} x pp {p.pipeline_stage}, {shard}; "
        f"worst device: pipeline stage {est.stage}, {_count(est.params_device)} parameters",
        f"  weights           {_gb(est.weights)}",
        f"  gradients         {_gb(est.grads)}",
        f"  optimizer states  {_gb(est.optimizer)}   (fp32 master + Adam m, v)",
        f"  accumulators      {_gb(est.accumulators)}   (fp32 gradient sums over the micro-batches, "
        f"4 bytes/parameter; none with one micro-batch)",
        f"  update            {_gb(est.trainer - est.accumulators)}   ({_step_note(est)})",
        f"  activations       {_gb(est.activations)}   ({len(est.layer_activations)} layers x "
        f"{est.in_flight} micro-batch(es) in flight, micro-batch {est.micro_batch} x seq {est.seq_length}; "
        f"recompute {cfg.recompute.mode})",
    ]
    if est.layer_activations:
        lo, hi = min(est.layer_activations), max(est.layer_activations)
        per_layer = _size(lo) if lo == hi else f"{_size(lo)} .. {_size(hi)}"
        lines.append(f"    per layer per micro-batch {per_layer}; LM head + logits {_size(est.head_activations)}"
                     + (f"; packed-document mask + rotary tables {_size(est.document_activations)} per micro-batch"
                        if est.document_activations else ""))
    lines += [f"  communication     {_gb(est.comm)}",
              f"  total             {_gb(est.total)}"]
    if device_bytes:
        verdict = "fits" if est.total <= device_bytes - margin else "does NOT fit"
        kept = (f" less a {_size(margin)} margin ({100 * margin / device_bytes:.0f}%: workspace, HCCL buffers, "
                f"fragmentation)" if margin else "")
        lines.append(f"device memory {device_bytes / GB:.2f} GB{kept}: {verdict} "
                     f"({100 * est.total / device_bytes:.0f}% used)")
    return "\n".join(lines)


def _step_note(est: Estimate) -> str:
    per = est.step_temps / max(1, est.params_device)
    if est.reuse:
        return (f"what its unscaled fp32 gradients, {_size(est.step_temps)}, need beyond backward's "
                f"freed gradients and activations")
    return f"CPU keeps every buffer of the graph: unscaled, clipped, zeroing {per:.0f} bytes/parameter"


def format_advice(advice: list[Advice], device_bytes: float) -> str:
    if not advice:
        return ""
    lines = ["cheapest changes, in order, each on top of the previous:"]
    for a in advice:
        lines.append(f"  {'FITS' if a.fits else '    '} {_gb(a.estimate.total)}  {a.change}")
    if not advice[-1].fits:
        lines.append(f"  nothing above fits in {device_bytes / GB:.2f} GB: more devices or a shorter sequence")
    return "\n".join(lines)


def dataset_shape(cfg, seq_length: int | None = None) -> tuple[int, int]:
    """(seq_length, vocab): from the dataset at data.path, or `seq_length` and model.vocab_size."""
    if seq_length and cfg.model.vocab_size:
        return seq_length, cfg.model.vocab_size
    if not cfg.data.path:
        raise ConfigError("train estimate needs the sequence length and vocabulary: set data.path to a "
                          "dataset dir (its manifest gives both), or pass --seq-length N with "
                          "model.vocab_size set")
    from mspretrain.loader.manifest import load_manifest

    manifest = load_manifest(cfg.data.path)
    return seq_length or manifest.seq_length, cfg.model.vocab_size or manifest.tokenizer.vocab_size



MARGIN = "10%"      # --margin's default: device memory kept free for what the estimate does not count
                    # (kernel workspace, HCCL buffers, the allocator's fragmentation)


def parse_margin(text: str, device_bytes: float) -> float:
    """'10%' or '0.1' -> that share of the device; '4GB' -> bytes (parse_size)."""
    raw = str(text).strip()
    try:
        share = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        return parse_size(raw)
    if share >= 1 and not raw.endswith("%"):
        return share                                # a plain number of bytes
    if not 0 <= share < 1:
        raise ConfigError(f"--margin {text!r}: a share of device memory must be in [0%, 100%)")
    return share * device_bytes
