"""The parallel plan (dp / mp / pp / optimizer sharding), a pure function of the config.

`make_plan(cfg, world_size)` validates cfg.parallel against the model and the world size (ConfigError
naming the keys) and returns a `Plan`: the shard strategy of every sharded primitive (the tuples
`Primitive.shard` takes), the layer -> pipeline stage map, the 1F1B figures, the optimizer-sharding
level and the dataset strategy. The model family's plan (ModelSpec.parallel_plan; Llama's:
mspretrain/train/models/llama/parallel.py) gives the strategy of every primitive its model holds; this
module adds the loss cell's (module "loss": the cross entropy on vocabulary-split logits with its EOD
loss mask). `apply.py` puts a plan onto a model and a step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mspretrain.train.config import ConfigError
from mspretrain.train.models import spec as model_spec
from mspretrain.train.models.spec import OpShard
from mspretrain.train.parallel import topology
from mspretrain.train.parallel.distributed import layout
from mspretrain.train.step.batching import check_batch, forward_batch

OPTIMIZER_LEVELS = ("level1", "level2", "level3")


@dataclass(frozen=True)
class Plan:
    world_size: int
    dp: int
    mp: int
    pp: int
    micro_batch_num: int
    vocab_emb_dp: bool
    sequence_parallel: bool
    optimizer_level: str | None         # None: no optimizer sharding (AutoParallel.hsdp not called)
    stage_layers: tuple                 # stage -> tuple of layer indices
    stage_of: dict                      # cell path -> stage (embedding first, norm + head last)
    ops: tuple                          # OpShard for every sharded operator
    dataset_strategy: tuple             # per input column: (dp, 1) -> each dp group reads G/dp samples
    schedule: str = "1f1b"
    in_flight: tuple = field(default=())   # 1F1B: micro-batches stage s holds at peak: min(p - s, m)

    @property
    def bubble(self) -> float:
        """Idle fraction of a 1F1B pipeline step: (p - 1) / (m + p - 1)."""
        return (self.pp - 1) / (self.micro_batch_num + self.pp - 1)

    def op(self, module: str, prim: str = "matmul") -> OpShard:
        for o in self.ops:
            if o.module == module and o.prim == prim:
                return o
        raise KeyError(f"no strategy for {module}.{prim}")


def validate(cfg, world_size: int, vocab_size: int | None = None, seq_length: int | None = None) -> None:
    """Every constraint the plan needs; ConfigError names the keys. vocab/seq: when known (dataset)."""
    p, m = cfg.parallel, cfg.model
    layout(cfg, 0, world_size)          # dp * mp * pp == world size, each >= 1
    mp, pp, dp = p.model_parallel, p.pipeline_stage, p.data_parallel
    if cfg.device != "Ascend" and (mp > 1 or pp > 1 or p.optimizer_shard):
        raise ConfigError(
            f"device {cfg.device}: parallel.model_parallel={mp}, parallel.pipeline_stage={pp}, "
            f"parallel.optimizer_shard={p.optimizer_shard} need MindSpore semi-auto parallel, which runs "
            f"on Ascend only; on {cfg.device} use data parallelism alone (model_parallel=1, pipeline_stage=1, "
            f"optimizer_shard=false)")
    check_suite_in_loop(cfg)
    model_spec.of(cfg).parallel_plan.validate(cfg, vocab_size or m.vocab_size, seq_length)
    if m.num_layers < pp:
        raise ConfigError(f"model.num_layers ({m.num_layers}) must be >= parallel.pipeline_stage ({pp})")
    if p.micro_batch_num < 1:
        raise ConfigError(f"parallel.micro_batch_num must be >= 1, got {p.micro_batch_num}")
    if pp > 1 and p.micro_batch_num < pp:
        raise ConfigError(f"parallel.micro_batch_num ({p.micro_batch_num}) must be >= "
                          f"parallel.pipeline_stage ({pp})")
    check_batch(cfg, dp)
    if p.sequence_parallel and mp == 1:
        raise ConfigError("parallel.sequence_parallel needs parallel.model_parallel > 1")
    if p.sequence_parallel and seq_length and seq_length % mp:
        raise ConfigError(f"parallel.sequence_parallel: the dataset's seq_length ({seq_length}) must be "
                          f"divisible by parallel.model_parallel ({mp})")
    if p.optimizer_shard and dp == 1:
        raise ConfigError("parallel.optimizer_shard shards over the data-parallel group: it needs "
                          "parallel.data_parallel > 1")
    if p.optimizer_level not in OPTIMIZER_LEVELS:
        raise ConfigError(f"parallel.optimizer_level must be one of {', '.join(OPTIMIZER_LEVELS)}, "
                          f"got {p.optimizer_level!r}")
    stage_layers(m.num_layers, pp, p.stage_offsets)
    check_validation(cfg)
    topology.check(cfg, world_size)


def check_suite_in_loop(cfg) -> None:
    """The in-loop eval suite runs on the main rank's model in memory, which holds the whole weights only
    when nothing is sharded: with slices, it would have to merge them and build a full model on one
    device while the other ranks wait in the next step's collectives."""
    p = cfg.parallel
    if cfg.eval.suite_in_loop and (p.model_parallel > 1 or p.pipeline_stage > 1 or p.optimizer_shard):
        raise ConfigError(
            f"eval.suite_in_loop=true needs an unsharded layout, got parallel.model_parallel="
            f"{p.model_parallel}, parallel.pipeline_stage={p.pipeline_stage}, parallel.optimizer_shard="
            f"{str(p.optimizer_shard).lower()}: set eval.suite_in_loop=false and evaluate the checkpoints "
            f"afterwards with `train eval RUN --tasks ...` (or --all-checkpoints), which merges the slices "
            f"in a process of its own")



def stage_layers(num_layers: int, pp: int, offsets: list | tuple = ()) -> tuple:
    """Layer indices per pipeline stage, contiguous and in order.

    Each stage gets num_layers // pp; the remainder goes one each to stages 1, 2, ... (never stage 0,
    which under 1F1B holds the most micro-batches in flight); then `offsets[s]` layers are added to
    stage s (parallel.stage_offsets: length pp, sum 0), e.g. [-1, 1] moves a layer from stage 0 to 1.
    """
    key = "parallel.stage_offsets"
    offsets = list(offsets or [0] * pp)
    if len(offsets) != pp:
        raise ConfigError(f"{key} has {len(offsets)} entries; it needs one per stage "
                          f"(parallel.pipeline_stage={pp})")
    if any(not isinstance(o, int) or isinstance(o, bool) for o in offsets):
        raise ConfigError(f"{key} must be a list of integers, got {offsets}")
    if sum(offsets):
        raise ConfigError(f"{key} {offsets} must sum to 0 (they move layers between stages)")
    base, extra = divmod(num_layers, pp)
    counts = [base + (1 if 1 <= s <= extra else 0) + offsets[s] for s in range(pp)]
    for s, n in enumerate(counts):
        if n < 1:
            raise ConfigError(f"{key} {offsets} leaves pipeline stage {s} with {n} layers "
                              f"(model.num_layers={num_layers}, parallel.pipeline_stage={pp})")
    stages, start = [], 0
    for n in counts:
        stages.append(tuple(range(start, start + n)))
        start += n
    return tuple(stages)


def make_plan(cfg, world_size: int | None = None, vocab_size: int | None = None,
              seq_length: int | None = None) -> Plan:
    p = cfg.parallel
    world = world_size or p.data_parallel * p.model_parallel * p.pipeline_stage
    validate(cfg, world, vocab_size, seq_length)
    dp, mp, pp = p.data_parallel, p.model_parallel, p.pipeline_stage
    stages = stage_layers(cfg.model.num_layers, pp, p.stage_offsets)
    family = model_spec.of(cfg).parallel_plan
    stage_of = family.stage_of(cfg, stages)
    ops = [*family.ops(cfg, dp, mp), *_loss_ops(dp, mp)]
    m = p.micro_batch_num if pp > 1 else 1
    return Plan(world_size=world, dp=dp, mp=mp, pp=pp, micro_batch_num=m, vocab_emb_dp=p.vocab_emb_dp,
                sequence_parallel=p.sequence_parallel,
                optimizer_level=p.optimizer_level if p.optimizer_shard else None,
                stage_layers=stages, stage_of=stage_of, ops=tuple(ops),
                dataset_strategy=((dp, 1),), in_flight=tuple(min(pp - s, m) for s in range(pp)))


def _loss_ops(dp: int, mp: int) -> list:
    """Cross entropy on logits split by vocabulary ([B*S, V] as (dp, mp)): reductions over V."""
    v, row = (dp, mp), (dp, 1)
    return [OpShard("loss", "inputs", "StridedSlice", ((dp, 1),)),      # input_ids [B, S+1] -> tokens
            OpShard("loss", "targets", "StridedSlice", ((dp, 1),)),     # and labels [B, S]
            OpShard("loss", "cast", "Cast", ((dp, 1, mp),)), OpShard("loss", "max", "ReduceMax", (v,)),
            OpShard("loss", "shift", "Sub", (v, row)), OpShard("loss", "exp", "Exp", (v,)),
            OpShard("loss", "sum_exp", "ReduceSum", (v,)), OpShard("loss", "log", "Log", ((dp,),)),
            OpShard("loss", "one_hot", "OneHot", (v, (), ())), OpShard("loss", "pick", "Mul", (v, v)),
            OpShard("loss", "sum_picked", "ReduceSum", (v,)), OpShard("loss", "nll", "Sub", ((dp,), (dp,))),
            OpShard("loss", "mean", "ReduceMean", ((dp,),)),
            # train.eod_mask_loss: input tokens [B, S] -> keep [B*S], the kept mean
            OpShard("loss", "keep", "NotEqual", ((dp, 1), ())), OpShard("loss", "cast_keep", "Cast", ((dp, 1),)),
            OpShard("loss", "masked", "Mul", ((dp,), (dp,))), OpShard("loss", "sum_masked", "ReduceSum", ((dp,),)),
            OpShard("loss", "count_kept", "ReduceSum", ((dp,),)),
            OpShard("loss", "at_least_one", "Maximum", ((), ())), OpShard("loss", "divide", "RealDiv", ((), ())),
            # validation's next-token accuracy (hits=True): from `picked`, already reduced over V
            OpShard("loss", "is_top", "GreaterEqual", ((dp,), ())), OpShard("loss", "cast_hit", "Cast", ((dp,),)),
            OpShard("loss", "hit_kept", "Mul", ((dp,), (dp,))), OpShard("loss", "sum_hits", "ReduceSum", ((dp,),))]


def format_plan(plan: Plan) -> str:
    lines = [f"world {plan.world_size} = data_parallel {plan.dp} x model_parallel {plan.mp} x "
             f"pipeline_stage {plan.pp}",
             f"dataset strategy {plan.dataset_strategy}: each data-parallel group reads 1/{plan.dp} "
             f"of the global batch",
             "optimizer sharding: " + (f"AutoParallel.hsdp(optimizer_level={plan.optimizer_level!r}) over "
                                       f"{plan.dp} data-parallel ranks" if plan.optimizer_level else "off"),
             f"sequence parallel: {'on' if plan.sequence_parallel else 'off'}; embedding split by "
             f"{'data (replicated table)' if plan.vocab_emb_dp else 'vocab'}"]
    if plan.pp > 1:
        lines.append(f"pipeline: {plan.schedule}, {plan.micro_batch_num} micro-batches, bubble "
                     f"(p-1)/(m+p-1) = {plan.bubble:.3f}")
        outside = [c for c in plan.stage_of if not c.startswith("layers.")]   # embedding, head...
        for s, layers in enumerate(plan.stage_layers):
            mine = [c for c in outside if plan.stage_of[c] == s]
            extra = f" + {', '.join(mine)}" if mine else ""
            lines.append(f"  stage {s}: layers {_ranges(layers)}{extra}; "
                         f"{plan.in_flight[s]} micro-batch(es) in flight")
    else:
        lines.append("pipeline: off (bubble 0)")
    lines.append("op strategies (one tuple per input; layer 0 shown, every layer alike):")
    for o in plan.ops:
        if o.module.startswith("layers.") and not o.module.startswith("layers.0"):
            continue
        out = f" out {o.out_strategy}" if o.out_strategy else ""
        lines.append(f"  {(o.module or 'model') + '.' + o.prim:<40} {o.kind:<19} {o.in_strategy}{out}")
    return "\n".join(lines)


def _ranges(layers) -> str:
    return f"{layers[0]}-{layers[-1]}" if len(layers) > 1 else str(layers[0])


def print_plan(cfg, world_size: int | None = None) -> None:
    """`train plan`: the plan for cfg (the dataset at data.path, when set, gives vocab and seq length)."""
    vocab = seq = None
    if cfg.data.path:
        from mspretrain.loader.manifest import load_manifest

        manifest = load_manifest(cfg.data.path)
        vocab, seq = cfg.model.vocab_size or manifest.tokenizer.vocab_size, manifest.seq_length
    plan = make_plan(cfg, world_size, vocab, seq)
    print(format_plan(plan))
    for warning in topology.check(cfg, plan.world_size):
        print(warning)


def check_validation(cfg) -> None:
    """Validation in the loop with pipeline stages is refused: the eval graph would run every layer on
    every rank, with the other stage's weights, which that rank never updates (a wrong val loss)."""
    if cfg.parallel.pipeline_stage > 1 and cfg.eval.every_steps:
        raise ConfigError(
            f"eval.every_steps={cfg.eval.every_steps} with parallel.pipeline_stage="
            f"{cfg.parallel.pipeline_stage}: validation in the loop does not run through pipeline stages "
            f"(each rank holds only its stage's current weights); set eval.every_steps=0 and run "
            f"`train eval` on the checkpoint (docs/parallel.md)")


def eval_batch_size(cfg) -> int:
    """The batch of one validation forward, the same whatever the layout: the per-rank training
    micro-batch (train.micro_batch_size, or global batch / data_parallel) times data_parallel. On Ascend
    with several ranks every rank feeds this whole batch (dataset strategy full_batch) and the compiled
    graph splits it by data_parallel; on CPU/GPU each rank evaluates all of it (the same number on every
    rank). Never the per-rank share alone, which full_batch would split by data_parallel again."""
    return forward_batch(cfg) * cfg.parallel.data_parallel
