"""Step-time model of `train estimate`: a few lines of arithmetic that rank layouts (recompute,
micro-batch, dp x mp x pp) by cost. It is not a forecast; measure the step time (`train doctor`).

Assumptions (printed by `train estimate`, listed in docs/parallel.md):
- compute: training FLOPs per token = 3 x the forward's (backward is twice the forward), the forward
  counted by the model family's terms (matmuls, attention scores); per device: the tokens of its
  data-parallel rank / model_parallel, for its pipeline stage's layers; run at COMPUTE_EFFICIENCY of
  train.peak_tflops (DEFAULT_PEAK_TFLOPS when 0).
- recompute: full adds one more forward of each recomputed layer, select the forward of each
  recomputed cell (attention: its projections and scores; mlp: its three matmuls), and the
  model-parallel all-reduces those forwards hold.
- communication, at a bus bandwidth per device (INTRA_NODE_GBPS inside a node, INTER_NODE_GBPS when
  the group spans nodes), never overlapped with compute, ring collectives (2 (n-1)/n of the message):
  model parallel 4 all-reduces (or reduce-scatter + all-gather) of a micro-batch's [tokens, hidden]
  activation per layer, 2 more per fully recomputed layer; data parallel one fp32 gradient reduction
  per step (optimizer sharding level1/2 the same volume; level3 adds a weight all-gather per
  micro-batch, forward and backward); pipeline a send and a receive of the boundary activation per
  micro-batch and neighbour.
- pipeline bubble (1F1B): the stage's busy time x (p - 1) / m.
- a micro-batch's size does not change the rate (larger matmuls do run closer to peak: ties go to
  the larger micro-batch).
"""
from __future__ import annotations

from dataclasses import dataclass

from mspretrain.train.models import spec as model_spec
from mspretrain.train.parallel.plan import stage_layers
from mspretrain.train.step.batching import local_batch, micro_batch, micro_batches

COMPUTE_EFFICIENCY = 0.5        # achieved / peak FLOP rate of a well-fed dense LLM step
DEFAULT_PEAK_TFLOPS = 280.0     # bf16 dense peak assumed for one NPU when train.peak_tflops is 0
INTRA_NODE_GBPS = 100.0         # HCCS, all-reduce bus bandwidth per device inside a node (assumed)
INTER_NODE_GBPS = 25.0          # RoCE, one 200 Gb/s port per device between nodes (assumed)


@dataclass(frozen=True)
class StepTime:
    compute: float              # seconds per step, forward + backward
    recompute: float            # the recomputed forwards
    comm: float                 # collectives, not overlapped
    bubble: float               # pipeline idle time
    stage: int                  # the slowest pipeline stage

    @property
    def total(self) -> float:
        return self.compute + self.recompute + self.comm + self.bubble


def assumptions(cfg) -> str:
    return (f"step time: FLOPs at {COMPUTE_EFFICIENCY:.0%} of {peak_tflops(cfg):.0f} TFLOPS, collectives at "
            f"{INTRA_NODE_GBPS:.0f} GB/s inside a node / {INTER_NODE_GBPS:.0f} GB/s across nodes, not "
            f"overlapped; recompute adds the recomputed forwards (a ranking, not a forecast)")


def peak_tflops(cfg) -> float:
    return cfg.train.peak_tflops or DEFAULT_PEAK_TFLOPS


def step_time(cfg, seq: int, vocab: int, rplan: dict) -> StepTime:
    """The modelled step time of the slowest pipeline stage; rplan: recompute_plan's layer -> cells."""
    p = cfg.parallel
    stages = stage_layers(cfg.model.num_layers, p.pipeline_stage, p.stage_offsets)
    times = [_stage_time(cfg, seq, vocab, s, layers, rplan) for s, layers in enumerate(stages)]
    return max(times, key=lambda t: t.total)


def _stage_time(cfg, seq: int, vocab: int, stage: int, layers: tuple, rplan: dict) -> StepTime:
    p, terms = cfg.parallel, model_spec.of(cfg).memory_terms
    rate = peak_tflops(cfg) * 1e12 * COMPUTE_EFFICIENCY
    tokens = local_batch(cfg) * seq                     # per data-parallel rank per step
    flops = terms.layer_flops(cfg, seq)
    forward = len(layers) * flops[""]
    if stage == p.pipeline_stage - 1:
        forward += terms.head_flops(cfg, vocab)
    again = sum(_recomputed(flops, rplan.get(i, ())) for i in layers)
    compute = tokens * 3 * forward / p.model_parallel / rate
    recompute = tokens * again / p.model_parallel / rate
    mp_comm = _mp_seconds(cfg, seq, layers, rplan)
    m = p.micro_batch_num if p.pipeline_stage > 1 else 1
    bubble = (compute + recompute + mp_comm) * (p.pipeline_stage - 1) / m
    n = terms.stage_params(cfg, vocab, stage, len(layers))
    comm = mp_comm + _dp_seconds(cfg, n) + _pp_seconds(cfg, seq, stage)
    return StepTime(compute=compute, recompute=recompute, comm=comm, bubble=bubble, stage=stage)


def _recomputed(flops: dict, modules: tuple) -> float:
    return flops[""] if "" in modules else sum(flops[m] for m in modules)


def message_bytes(cfg, seq: int, micro: int) -> float:
    """One micro-batch's [tokens, hidden] activation in the compute dtype: what a model-parallel
    all-reduce or a pipeline send moves (and what memory.py's communication buffers hold)."""
    b = 4 if cfg.precision.dtype == "fp32" else 2
    return seq * micro * cfg.model.hidden_size * b


def _ring(n: int) -> float:
    return 2 * (n - 1) / n


def _bandwidth(span: int, cfg) -> float:
    """Bytes/s of a collective over `span` consecutive ranks."""
    return (INTRA_NODE_GBPS if span <= cfg.parallel.devices_per_node else INTER_NODE_GBPS) * 1e9


def _mp_seconds(cfg, seq: int, layers: tuple, rplan: dict) -> float:
    mp = cfg.parallel.model_parallel
    if mp == 1:
        return 0.0
    per_layer = 0
    for i in layers:
        modules = rplan.get(i, ())
        per_layer += 4 + (2 if "" in modules else sum(m in modules for m in ("attention", "mlp")))
    volume = micro_batches(cfg) * per_layer * _ring(mp) * message_bytes(cfg, seq, micro_batch(cfg))
    return volume / _bandwidth(mp, cfg)


def _dp_seconds(cfg, params: float) -> float:
    p = cfg.parallel
    if p.data_parallel == 1:
        return 0.0
    span = p.data_parallel * p.model_parallel           # a dp group's ranks are mp apart
    volume = params * 4 * _ring(p.data_parallel)        # fp32 gradients, once per step
    if p.optimizer_shard and p.optimizer_level == "level3":
        b = 4 if cfg.precision.dtype == "fp32" else 2
        volume += 2 * micro_batches(cfg) * params * b * (p.data_parallel - 1) / p.data_parallel
    return volume / _bandwidth(span, cfg)


def _pp_seconds(cfg, seq: int, stage: int) -> float:
    p = cfg.parallel
    if p.pipeline_stage == 1:
        return 0.0
    neighbours = (stage > 0) + (stage < p.pipeline_stage - 1)
    split = p.model_parallel if p.sequence_parallel else 1
    volume = 2 * neighbours * micro_batches(cfg) * message_bytes(cfg, seq, micro_batch(cfg)) / split
    return volume / _bandwidth(2 * p.data_parallel * p.model_parallel, cfg)
