"""How a parallel plan is applied from outside the model.

`annotate` (strategies and stages onto the model) and `wrap` (AutoParallel) are the only code touching
MindSpore's semi-auto parallel API, which runs on Ascend only (MindSpore 2.10 refuses semi_auto on CPU).
On CPU/GPU only data parallelism runs, through the DATA_PARALLEL context (parallel/distributed.py).
`annotate` also tells the model's DocumentBoundaries the dp degree, so that packed documents' ends
restart at every shard boundary (mspretrain/train/packing.py).
"""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from mspretrain.train.parallel.distributed import all_reduce_sum, all_reduce_weighted_mean
from mspretrain.train.parallel.plan import Plan, check_validation, make_plan


def grad_reducer(dist, parameters):
    """A cell that all-reduces (sums) gradients across CPU/GPU data-parallel ranks. A sum, not a mean:
    each rank's gradient is already its share of d(loss sum / N) with N the global batch's token count
    (train.step.cell), so the shares add up to the gradient of the whole batch."""
    from mindspore import nn

    return nn.DistributedGradReducer(parameters, mean=False, degree=dist.world_size)


class GlobalLossStep:
    """The train step of a multi-rank job, seen from the loop.

    Before the step: N, the loss tokens of the global batch, summed over one rank of each data-parallel
    group (the ranks of a model-parallel group and the pipeline stages read the same rows), so that
    every rank divides by the same N. After it: the global batch's mean loss. `loss_is_share` (CPU data
    parallel): each rank returned its rows' loss sum / N, and the global loss is the sum over the
    ranks. Otherwise (AutoParallel): the ranks that compute the loss (all, or the last pipeline stage's)
    hold the global batch's loss, and it is their mean. Everything else is forwarded to the wrapped
    train step (state_parameters, loss_scale...)."""

    def __init__(self, step, dist, computes_loss: bool, counts_tokens: bool = True,
                 loss_is_share: bool = False):
        self._step, self._dist = step, dist
        self._weight = 1.0 if computes_loss else 0.0
        self._counts, self._share = counts_tokens, loss_is_share

    def __getattr__(self, name):
        return getattr(self._step, name)

    def __call__(self, input_ids, lr):
        local = self._step.count_tokens(input_ids) if self._counts else 0
        tokens = all_reduce_sum(self._dist, local)
        result = self._step(input_ids, lr, tokens=tokens)
        reduce = ((lambda v: all_reduce_sum(self._dist, float(v))) if self._share
                  else (lambda v: all_reduce_weighted_mean(self._dist, v, self._weight)))
        z = reduce(result.z_loss) if self._step.step_cell.z_value is not None else result.z_loss
        return dataclasses.replace(result, loss=reduce(result.loss), z_loss=z)


def counts_tokens(plan_or_cfg, rank: int) -> bool:
    """Whether `rank` adds its rows' token count to the global N: the first rank of its model-parallel
    group on the first pipeline stage (rank = stage * dp * mp + dp_rank * mp + mp_rank)."""
    return rank % plan_or_cfg.parallel.model_parallel == 0 and rank_stage(plan_or_cfg, rank) == 0


def reduction(cfg, dist, parameters, micro_steps: int, loop: bool):
    """How the step combines its ranks' work (train.step.cell.Reduction), chosen before the step is built.

    One rank: nothing. No AutoParallel runs there, so no compiler pass fills `accu_grads`: the step's
    own accumulated gradients are the sum (an accumulator reducer would read zeros). CPU/GPU data
    parallel: a summing DistributedGradReducer, the loss a rank's share. Ascend: the compiler reduces;
    with accumulation the step reads the sums it put into `accu_grads.*`."""
    from mspretrain.train.step.cell import Reduction

    if dist.world_size == 1:
        return Reduction()
    if cfg.device != "Ascend":
        return Reduction(grad_reducer(dist, parameters), reduce_overflow=True, loss_is_share=True)
    last_stage = rank_stage(cfg, dist.rank) == cfg.parallel.pipeline_stage - 1
    return Reduction(accumulation_grad_reducer(cfg, parameters, micro_steps, loop), reduce_overflow=True,
                     computes_loss=last_stage)


def rank_stage(cfg, rank: int) -> int:
    """The pipeline stage of `rank` (rank = stage * dp * mp + dp_rank * mp + mp_rank)."""
    return rank // (cfg.parallel.data_parallel * cfg.parallel.model_parallel)


def parallelize(cfg, dist, model, train_step, strategy_file: str | None = None, loss_cell=None):
    """The object to run for `train_step` (train.step.cell.TrainStep, built with `reduction`): a new one;
    the step itself is not changed.

    One rank: the step. CPU/GPU data parallel: the step behind GlobalLossStep. Ascend: the plan's
    strategies and stages set on `model`, and a step whose cell runs inside AutoParallel: one graph,
    compiled once. With several ranks the reported loss is the global batch's (GlobalLossStep).
    """
    if dist.world_size == 1:
        return train_step
    cell = train_step.step_cell
    if not cell.reduce_overflow:
        raise RuntimeError("parallelize: the step was built for one rank; build it with "
                           "train.parallel.apply.reduction(cfg, dist, ...)")
    if cfg.device != "Ascend":
        check_grad_reduction(cell)
        return GlobalLossStep(train_step, dist, computes_loss=True, loss_is_share=True)
    plan = make_plan(cfg, dist.world_size, model_vocab(model))
    annotate(plan, model, train_step.loss_cell)
    if loss_cell is not None:       # the validation loss cell: its own primitives
        annotate(plan, model, loss_cell)
    stage = rank_stage(cfg, dist.rank)
    # pipeline stages: each saves (and loads) its own tensors only
    keep = stage_state_filter(plan, stage, cfg.model.tie_embeddings) if plan.pp > 1 else None
    from mspretrain.train.step.cell import TrainStep

    runner = wrap(plan, cell, strategy_file or str(strategy_path(cfg, dist)))
    from mspretrain.train.switches import apply_to_auto_parallel
    # fusion buckets and overlap switches on the AutoParallel cell: it resets the context at compile
    apply_to_auto_parallel(cfg, runner, strategy_path(cfg, dist).with_name(f"speed_up_rank_{dist.rank}.json"))
    wrapped = TrainStep(cell, train_step.eod_id, loss_cell=train_step.loss_cell, keep_state=keep,
                        runner=runner)
    return GlobalLossStep(wrapped, dist, computes_loss=cell.computes_loss,      # as `reduction` built it
                          counts_tokens=counts_tokens(cfg, dist.rank))


_STATE_PREFIXES = ("adam_m.", "adam_v.", "accu_grads.")


def stage_state_filter(plan: Plan, stage: int, tied: bool = False):
    """name -> whether a state parameter belongs to pipeline `stage`: the weights of the cells the plan
    puts there (and their AdamW moments); step counters, learning rate and loss scale everywhere. The
    other stage's tensors are not in this rank's graph: unsliced, never updated, their moments lazy
    zeros, which a checkpoint would store at full size (~78 GB per rank for llama-13b). A tied
    embedding table serves the first and the last stage: both keep it."""
    def owner(name: str) -> int | None:
        for prefix in _STATE_PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix):]
        name = name[len("model."):] if name.startswith("model.") else name
        for path, s in plan.stage_of.items():
            if name.startswith(path + "."):
                return s
        return None

    def keep(name: str) -> bool:
        s = owner(name)
        if s is None:
            return True
        if tied and name.split("model.")[-1].startswith("tok_embeddings."):
            return stage in (0, plan.pp - 1)
        return s == stage
    return keep


def parallel_forward(cfg, dist, model, loss_net):
    """The loss cell to evaluate with: on Ascend with several ranks, wrapped in AutoParallel with the
    model's strategies (already set by `parallelize`) and every rank feeding the full eval batch
    (`eval_batch_size`), so that it runs on the sliced weights; elsewhere `loss_net` itself."""
    if dist.world_size == 1 or cfg.device != "Ascend":
        return loss_net
    check_validation(cfg)
    plan = make_plan(cfg, dist.world_size, model_vocab(model))
    return wrap(plan, loss_net, None, dataset_strategy="full_batch", pipeline=False)


def model_vocab(model) -> int | None:
    args = getattr(model, "args", None)
    return getattr(args, "vocab_size", None)


def annotate(plan: Plan, model, loss_cell=None) -> list:
    """Set every planned strategy on the primitives of the model (and of `loss_cell`, the plan's
    "loss" module) and the pipeline stage on its cells.

    Strict: a planned op whose cell or primitive is missing, or of another kind, is an error (the
    model's names changed). Returns the (module, prim) pairs it sharded. Runs on any device: it only
    records the strategies; MindSpore's semi-auto compiler uses them (Ascend).
    """
    cells = dict(model.cells_and_names())
    if loss_cell is not None:
        cells["loss"] = loss_cell
    done = []
    for o in plan.ops:
        cell = cells.get(o.module)
        prim = getattr(cell, "_primitives", {}).get(o.prim) if cell is not None else None
        if prim is None or prim.name != o.kind:
            _refuse_plain_dense(o.module, cell)
            found = "no such cell" if cell is None else f"primitives {sorted(cell._primitives)}"
            raise RuntimeError(f"parallel plan: {o.kind} {o.module or 'model'}.{o.prim} not found ({found})")
        if o.out_strategy is None:
            prim.shard(o.in_strategy)
        else:
            prim.shard(o.in_strategy, o.out_strategy)
        done.append((o.module, o.prim))
    from mspretrain.train.packing import DocumentBoundaries

    for cell in cells.values():
        if isinstance(cell, DocumentBoundaries):
            cell.data_parallel = plan.dp        # document ends restart at each data-parallel shard
    if plan.pp > 1:
        for path, stage in plan.stage_of.items():
            if path not in cells:
                raise RuntimeError(f"parallel plan: pipeline cell {path} not found in the model")
            cells[path].pipeline_stage = stage
    return done


def _refuse_plain_dense(path: str, cell) -> None:
    """A family's layer built as mindspore's plain nn.Dense lacks the O2 casts that the plan shards:
    say so, naming the layer and what to build it with, rather than only the missing primitive."""
    from mindspore import nn

    from mspretrain.train.models import layers
    if isinstance(cell, nn.Dense) and not isinstance(cell, layers.Dense):
        raise RuntimeError(f"parallel plan: {layers.plain_dense_message([path])}")


def lazy_inline_loss(cfg) -> bool:
    """The train loss cell as one reused sub-graph (train.step.loss.ReusedCausalLMLoss, mindspore.lazy_inline,
    on the outermost cell as MindFormers does): with pipeline stages, which run on Ascend only.
    MindSpore 2.10's CPU backend refuses lazy_inline ("CPU does not support the lazy_inline feature"),
    so it is never on elsewhere."""
    return cfg.parallel.pipeline_stage > 1


def pipeline_loss_cell(cfg, loss_cell):
    """With pipeline stages, the loss cell that splits each step into parallel.micro_batch_num
    micro-batches and sums their losses (mindspore.parallel.nn.Pipeline); None without."""
    if cfg.parallel.pipeline_stage == 1:
        return None
    from mindspore.parallel.nn import Pipeline

    return Pipeline(loss_cell, cfg.parallel.micro_batch_num)


def uses_accumulators(cfg, micro_steps: int, loop: bool) -> bool:
    """Whether the compiler accumulates micro-batch gradients into `accu_grads.*` buffers: Ascend
    with pipeline stages, or with the split accumulation (GradAccumulation, K > 1), whose micro-step
    mirrors (`_MirrorMicroStepOperator`, `_MicroStepAllGather` with optimizer sharding) look up
    `accu_grads.<parameter>` and fail the compile without them."""
    if cfg.device != "Ascend":
        return False
    return cfg.parallel.pipeline_stage > 1 or (micro_steps > 1 and not loop)


def accumulation_grad_reducer(cfg, parameters, micro_steps: int = 1, loop: bool = False):
    """The step cell's gradient slot for Ascend accumulation (`uses_accumulators`): takes the
    micro-batch gradient sums the compiler accumulated into the `accu_grads.*` buffers, and zeroes
    those; identity otherwise. MindFormers' pattern (MFPipelineWithLossScaleCell, which it uses for
    both pipeline and gradient accumulation in semi-auto).

    With optimizer sharding: MindSpore's PipelineGradReducer(opt_shard=True) (the gradients themselves,
    then the buffers zeroed). Without: our PipelineAccumulator, which does what PipelineGradReducer's
    other branch means to do (that branch fails in graph mode in MindSpore 2.10 with "NameError: The
    name 'grads' is not defined"). Scale 1 in both: the step cell unscales itself."""
    from mindspore import nn

    if not uses_accumulators(cfg, micro_steps, loop):
        return nn.Identity()
    if cfg.parallel.optimizer_shard:
        from mindspore.parallel.nn import PipelineGradReducer

        return PipelineGradReducer(parameters, scale_sense=1.0, opt_shard=True)
    from mspretrain.train.step.cell import PipelineAccumulator

    return PipelineAccumulator(parameters)


def pipeline_grad_reducer(cfg, parameters):
    """accumulation_grad_reducer for a pipeline step (K = parallel.micro_batch_num)."""
    return accumulation_grad_reducer(cfg, parameters, cfg.parallel.micro_batch_num)


def wrap(plan: Plan, cell, strategy_file: str | None = None, dataset_strategy=None, pipeline: bool = True):
    """AutoParallel(cell, "semi_auto") configured from the plan (Ascend; needs init())."""
    from mindspore.parallel.auto_parallel import AutoParallel

    net = AutoParallel(cell, parallel_mode="semi_auto")
    net.dataset_strategy(dataset_strategy or plan.dataset_strategy)
    # gradients_mean stays False (AutoParallel's default, MindFormers' `gradients_mean: False` in every
    # semi-auto config): the compiler already makes each rank's gradient a share whose sum over the
    # replicas is the gradient (_VirtualDiv, the backward of the forward all-reduces); the mean flag
    # would divide it again by the mirror group's size. loss_repeated_mean stays True (the default).
    if plan.optimizer_level:
        net.hsdp(optimizer_level=plan.optimizer_level)
    if plan.pp > 1 and pipeline:
        net.pipeline(stages=plan.pp, scheduler=plan.schedule)
    if strategy_file:
        Path(strategy_file).parent.mkdir(parents=True, exist_ok=True)
        net.save_param_strategy_file(str(strategy_file))
        net.disable_strategy_file_only_for_trainable_params()   # Adam moments too: needed to merge them
    return net


def check_grad_reduction(train_cell) -> None:
    """Refuse a data-parallel train cell that would not all-reduce (sum) its gradients: its shares
    of the global batch's gradient (train.step.cell normalises by the global token count)."""
    from mindspore import nn

    reducers = [c for _, c in train_cell.cells_and_names() if isinstance(c, nn.DistributedGradReducer)]
    if not reducers:
        raise RuntimeError(
            f"{type(train_cell).__name__} has no DistributedGradReducer: gradients would not be averaged "
            "across ranks. Give it a `grad_reducer` slot, or build nn.TrainOneStepCell after "
            "train.parallel.distributed.setup() (it reads the DATA_PARALLEL context).")
    for r in reducers:
        if r.mean:
            raise RuntimeError("the DistributedGradReducer means gradients; the step's are shares of the "
                               "global batch's gradient (divided by its token count) and need the sum")


def strategy_path(cfg, dist) -> Path:
    """Where a rank's compiled parameter strategy goes (AutoParallel.save_param_strategy_file)."""
    return Path(cfg.run.dir) / "strategy" / f"rank_{dist.rank}.ckpt"


def copy_strategy(cfg, dist, ckpt_dir) -> Path | None:
    """Put this rank's strategy file beside a sharded checkpoint: CKPT/strategy/rank_R.ckpt.

    Not inside CKPT/rank_R/: MindSpore's transform_checkpoints takes the last *.ckpt of each rank
    directory as that rank's weights. CKPT/strategy/ is what merge_pipeline_strategys reads
    (docs/parallel.md). Returns the copy, or None when there is no strategy (not sharded / not Ascend).
    """
    src = strategy_path(cfg, dist)
    if not dist.sharded or not src.is_file():
        return None
    dst = Path(ckpt_dir) / "strategy" / src.name
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return dst
