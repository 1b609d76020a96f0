"""The training step: one GRAPH_MODE cell per optimizer step, and a small Python driver.

`TrainStepCell(input_ids, lr)` does, in one graph: forward and backward over the K micro-batches of
the rank's batch, the accumulation of their gradients, loss scaling, the data-parallel gradient mean
(`grad_reducer`: a sum across CPU data-parallel ranks, identity in one process and under AutoParallel,
where the compiler inserts it; on Ascend with accumulation it reads the `accu_grads.*` sums), the
unscale by the loss scale, an all-finite flag (all-reduced across ranks when distributed), the global
gradient norm (each square sum tagged `grad_scale`, the pattern MindSpore's semi-auto compiler
all-reduces across model-parallel slices), clipping, AdamW unless a gradient overflowed, and the
dynamic loss-scale update. One graph means one compile derives every parameter layout under
AutoParallel (the weights, AdamW moments and accumulators are sliced once, consistently).

How the K micro-batches are accumulated (`accumulate`):
- "loop": a graph while-loop over the micro-batches; each iteration runs forward + backward of one
  micro-batch and adds its gradients into fp32 accumulators (`accu_grads.*`). The loop body is one
  sub-graph, so its intermediates exist once: activation memory is one micro-batch's. The CPU/GPU
  default (MindSpore's CPU runtime keeps every intermediate of an unrolled graph alive).
- "split": the batch is cut into K slices inside the graph and their losses summed (MindSpore's
  `parallel.nn.GradAccumulation`, whose slices carry `grad_accu_num`), then one backward. What the
  semi-auto compiler expects on Ascend; on CPU it holds K micro-batches' activations.
- K == 1, or a pipeline (`parallel.nn.Pipeline`, which splits and sums itself): plain forward/backward.
Normalisation by the global token count (every mode, every layout): the loss cell returns the *sum*
of its tokens' losses (CausalLMLoss reduction "sum"; EOS inputs left out with train.eod_mask_loss),
and backward starts from sens = scale / N, N the number of loss tokens in the whole global batch (all
micro-batches, all data-parallel ranks; counted on the host, `count_loss_tokens`, and summed across
ranks by train.parallel.apply.GlobalLossStep). So each micro-batch and each rank contributes its share of
d(sum of losses / N), the contributions are *summed* (loop accumulators, GradAccumulation's one
backward, the pipeline's `accu_grads`, a summing DistributedGradReducer on CPU, semi-auto's own
reduction on Ascend), and one device, dp = N and K micro-batches compute the same gradient in another
summation order. The gradients are then multiplied by 1 / scale.

Overflow policy: a non-finite gradient skips the update (weights, moments and the optimizer's step
counter untouched). With fp16 the scale halves (not below `min`) and grows by `factor` after `window`
clean steps; with fp32/bf16 the scale stays 1. Whether a step is *bad* (non-finite loss) is the
trainer's call, not the step's.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common import dtype as mstype

from mspretrain.train.config import ConfigError


ACCUMULATE = ("auto", "loop", "split")
ACCU_PREFIX = "accu_grads"      # the name MindSpore's optimizer-sharding pass gives layouts to
_CONSTANTS = {"scale_sense"}    # PipelineGradReducer's fixed scale (1: the step cell unscales)
# observations, not state: the host's spike thresholds, the loss cell's z-loss reading (spike.py)
_NOT_STATE = {"spike_limits", "z_loss_value"}


def accumulate_mode(cfg) -> str:
    """train.accumulate resolved: auto is split on Ascend (what AutoParallel compiles), loop elsewhere."""
    mode = cfg.train.accumulate
    if mode not in ACCUMULATE:
        raise ConfigError(f"train.accumulate must be one of {', '.join(ACCUMULATE)}, got {mode!r}")
    if mode == "auto":
        return "split" if cfg.device == "Ascend" else "loop"
    return mode


def loops(cfg, micro_steps: int, splits_batch: bool = False) -> bool:
    """Whether the step accumulates its micro-batches in a graph loop (train.accumulate "loop"), not
    in a loss cell that splits the batch itself (GradAccumulation, a pipeline)."""
    return accumulate_mode(cfg) == "loop" and not splits_batch and micro_steps > 1


@dataclass(frozen=True)
class Reduction:
    """How a step combines its ranks' work, fixed when the step is built (train.parallel.apply.reduction):
    the gradient slot (identity, a summing all-reduce, or the compiler's accumulators), whether the
    overflow and spike flags are all-reduced, and whether the loss is this rank's share (CPU data
    parallel) to be all-reduced for the spike test."""
    grad_reducer: object = None         # an nn.Cell; None: identity
    reduce_overflow: bool = False
    loss_is_share: bool = False
    # False on the pipeline stages before the last: their loss output is no loss, so the in-graph
    # loss spike test reads only the ranks that compute it (the all-reduced flag carries the decision)
    computes_loss: bool = True


# tagged so that the semi-auto compiler all-reduces each square sum over the slices of a sharded
# gradient (HandleGlobalNormScale): the norm is then global, the same on every rank
_grad_scale_expand = ops.ExpandDims().add_prim_attr("grad_scale", True)


def _square_sum(g):
    s = ops.ReduceSum(False)(ops.square(g.astype(mstype.float32)), ())
    return _grad_scale_expand(s, 0)


def _dot_square_sum(g):
    """The same sum as one BLAS dot product of the flattened gradient: one pass, no temporary (the CPU
    backend runs square and ReduceSum as two kernels with a gradient-sized temporary in between, about
    4x slower). Not under AutoParallel, where a reshape of a sharded gradient would be redistributed."""
    flat = g.astype(mstype.float32).reshape(1, -1)
    return ops.matmul(flat, flat.T).reshape((1,))


def _multiply(coef, g):
    return g * coef.astype(g.dtype)


def _zero(a):
    return ops.assign(a, ops.zeros_like(a))


class MicroBatchSum(nn.Cell):
    """Sum of the losses of K equal slices of the batch, in slice order (GradAccumulation's shape,
    without its parallel attributes)."""

    def __init__(self, network: nn.Cell, k: int):
        super().__init__(auto_prefix=False)
        self.network, self.k = network, k

    def construct(self, input_ids):
        b = input_ids.shape[0] // self.k
        total = self.network(input_ids[0:b])
        for i in range(1, self.k):
            total = total + self.network(input_ids[i * b:(i + 1) * b])
        return total


def split_cell(loss_net: nn.Cell, k: int, device: str) -> nn.Cell:
    """The loss cell of the split mode: MindSpore's GradAccumulation on Ascend, MicroBatchSum elsewhere."""
    if device == "Ascend":
        from mindspore.parallel.nn import GradAccumulation

        return GradAccumulation(loss_net, k)
    return MicroBatchSum(loss_net, k)


def _take_accumulated(grad, accu):
    accu = ops.depend(accu, grad)           # after this micro-batch's gradient was added in
    value = accu * 1.0
    accu = ops.depend(accu, value)
    return ops.depend(value, ops.assign(accu, ops.zeros_like(accu)))


class PipelineAccumulator(nn.Cell):
    """Pipeline stages without optimizer sharding: the gradients are the sums the compiler's pipeline
    pass accumulated into `accu_grads.*` over the micro-batches; read them, then zero them."""

    def __init__(self, parameters):
        super().__init__(auto_prefix=False)
        self.accu_grads = parameters.clone(prefix=ACCU_PREFIX, init="zeros")
        self.hyper_map = ops.HyperMap()

    def construct(self, grads):
        return self.hyper_map(_take_accumulated, grads, self.accu_grads)


class TrainStepCell(nn.Cell):
    """One optimizer step in one graph: (input_ids [B, S+1] int32, lr fp32, tokens fp32) -> (this rank's
    share of the mean loss, overflow, grad norm [1], loss scale used). `network`: the loss cell (the
    *sum* of a batch's token losses); with `splits_batch` it already splits the batch into
    `micro_steps` parts and sums their losses. `tokens`: N, the loss tokens of the global batch."""

    def __init__(self, network: nn.Cell, optimizer: nn.Optimizer, micro_steps: int, clip_norm: float,
                 dynamic_scale: bool, scale_cfg, loop: bool = False, splits_batch: bool = False,
                 reduction: Reduction = Reduction(), norm_by_dot: bool = False):
        super().__init__(auto_prefix=False)
        if loop and splits_batch:
            raise ValueError("TrainStepCell: loop and splits_batch exclude each other")
        self.network = network
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.micro_steps = int(micro_steps)
        self.loop = bool(loop) and self.micro_steps > 1
        self.accumulators = (self.weights.clone(prefix=ACCU_PREFIX, init="zeros") if self.loop
                             else ())
        init_scale = scale_cfg.init if dynamic_scale else 1.0
        self.loss_scale = Parameter(Tensor(init_scale, mstype.float32), name="loss_scale",
                                    requires_grad=False)
        self.good_steps = Parameter(Tensor(0, mstype.int32), name="loss_scale_good_steps",
                                    requires_grad=False)
        self.grad_reducer = reduction.grad_reducer if reduction.grad_reducer is not None else nn.Identity()
        self.reduce_overflow = reduction.reduce_overflow
        self.loss_is_share = reduction.loss_is_share
        self.computes_loss = reduction.computes_loss
        self.allreduce = ops.AllReduce()
        self.clip_norm = float(clip_norm)
        self.norm_by_dot = norm_by_dot      # the gradient norm's square sums as dot products (CPU/GPU)
        self.dynamic = dynamic_scale
        self.factor, self.window = float(scale_cfg.factor), int(scale_cfg.window)
        self.min_scale = float(scale_cfg.min)
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.hyper_map = ops.HyperMap()
        # train.spike: [loss limit, grad-norm limit], set by the host before each step (+inf: off)
        self.spike_limits = Parameter(Tensor(np.full(2, np.inf, np.float32)), name="spike_limits",
                                      requires_grad=False)
        self.z_value = z_loss_reading(network)

    def construct(self, input_ids, lr, tokens):
        scale = self.loss_scale * 1.0                  # the value this step used
        per_token = scale / ops.maximum(tokens, 1.0)   # d(loss sum / N) * scale: the sens of every backward
        if self.loop:
            loss, grads, z_sum = self.accumulate(input_ids, per_token)
        else:
            loss = self.network(self.zero_z(input_ids))
            z_sum = self.z_of(loss)     # all K micro-batches' terms (split, pipeline): the loss cell adds
            sens = ops.ones_like(loss) * per_token.astype(loss.dtype)
            grads = self.grad(self.network, self.weights)(input_ids, sens)
        grads = self.grad_reducer(grads)
        # One pass to measure, one to scale: the norm of the scaled gradient, times 1 / scale, is the
        # norm of the gradient; a non-finite gradient makes it non-finite (the overflow flag).
        inv = 1.0 / scale
        squares = self.hyper_map(_dot_square_sum if self.norm_by_dot else _square_sum, grads)
        norm = ops.sqrt(ops.addn(squares)) * inv
        overflow = self.overflowed(norm)
        coef = inv
        if self.clip_norm > 0:
            coef = ops.minimum(self.clip_norm / (norm + 1e-6), 1.0) * inv
        grads = self.hyper_map(ops.partial(_multiply, coef), grads)
        lr = ops.depend(lr, grads)
        ops.assign(self.optimizer.learning_rate, lr)
        mean_loss = loss.astype(mstype.float32) / ops.maximum(tokens, 1.0)
        z_mean = z_sum / ops.maximum(tokens, 1.0)
        # the spike test reads the global batch's loss: on CPU data parallel each rank holds its share
        global_loss = self.allreduce(mean_loss) if self.loss_is_share else mean_loss
        over = global_loss > self.spike_limits[0]
        if not self.computes_loss:      # an earlier pipeline stage: its loss output is no loss
            over = ops.zeros_like(over)
        spiked = ops.logical_or(over, norm.reshape(()) > self.spike_limits[1])
        if self.reduce_overflow:        # one rank's spike skips every rank's step, as an overflow does
            spiked = self.allreduce(spiked.astype(mstype.float32)) > 0
        if not ops.logical_or(overflow, spiked):
            self.optimizer(grads)
        self.update_scale(overflow)
        return mean_loss, overflow, norm, scale, z_mean, spiked

    def accumulate(self, input_ids, per_token):
        """The loop mode: zero the accumulators, then one micro-batch per iteration."""
        zeroed = self.hyper_map(_zero, self.accumulators)
        ids = ops.depend(input_ids, zeroed)
        b = ids.shape[0] // self.micro_steps
        chunks = ids.reshape(self.micro_steps, b, ids.shape[1])
        total = ops.zeros((), mstype.float32)
        z_total = ops.zeros((), mstype.float32)
        i = Tensor(0, mstype.int32)
        while i < self.micro_steps:
            chunk = ops.gather(chunks, i, 0)
            loss = self.network(self.zero_z(chunk))
            z_total = z_total + self.z_of(loss)
            sens = ops.ones_like(loss) * per_token.astype(loss.dtype)
            grads = self.grad(self.network, self.weights)(chunk, sens)
            added = self.hyper_map(ops.assign_add, self.accumulators, grads)
            total = ops.depend(total + loss.astype(mstype.float32), added)
            i = i + 1
        return total, self.accumulators, z_total

    def zero_z(self, input_ids):
        """`input_ids`, after the z-loss reading is zeroed: the forward that follows adds its terms."""
        if self.z_value is None:
            return input_ids
        return ops.depend(input_ids, ops.assign(self.z_value, ops.zeros_like(self.z_value)))

    def z_of(self, loss):
        """The z-loss term of the forward that gave `loss` (0 when train.z_loss is off)."""
        if self.z_value is None:
            return ops.zeros((), mstype.float32)
        return ops.depend(self.z_value, loss) * 1.0

    def overflowed(self, norm):
        flag = ops.logical_not(ops.isfinite(norm)).reshape(())
        if self.reduce_overflow:        # any rank's overflow skips every rank's step
            flag = self.allreduce(flag.astype(mstype.float32)) > 0
        return flag

    def update_scale(self, overflow):
        if self.dynamic:
            good = self.good_steps + 1
            grow = good >= self.window
            grown = ops.select(grow, self.loss_scale * self.factor, self.loss_scale)
            shrunk = ops.maximum(self.loss_scale / self.factor, self.min_scale)
            new_scale = ops.select(overflow, shrunk, grown)
            new_good = ops.select(ops.logical_or(overflow, grow), ops.zeros_like(good), good)
            ops.assign(self.loss_scale, new_scale)
            ops.assign(self.good_steps, new_good)


def count_loss_tokens(input_ids: np.ndarray, eod_id: int) -> int:
    """The positions of a batch [B, S+1] whose loss counts: all B * S, or with the EOD loss mask
    (eod_id >= 0) those whose input token is not EOS (CausalLMLoss's `keep`)."""
    inputs = np.asarray(input_ids)[:, :-1]
    if eod_id < 0:
        return int(inputs.size)
    return int(np.count_nonzero(inputs != eod_id))


@dataclass
class StepResult:
    loss: float              # the mean token loss of the batch the step saw (GlobalLossStep: the global one)
    overflow: bool
    grad_norm: float
    loss_scale: float
    z_loss: float = 0.0      # the z-loss term in `loss` (train.z_loss)
    spiked: bool = False     # over the host's spike thresholds: the update was not applied


class TrainStep:
    """Runs the step cell from numpy. `runner`: what runs it (its AutoParallel wrapper; default the cell
    itself); `loss_cell`: the loss cell inside it, whose primitives a parallel plan annotates;
    `keep_state`: name -> bool, the state this rank owns (pipeline stages: its stage's)."""

    def __init__(self, cell: TrainStepCell, eod_id: int = -1, loss_cell: nn.Cell | None = None,
                 runner: nn.Cell | None = None, keep_state=None):
        self.step_cell = cell
        self.cell = runner if runner is not None else cell
        self.eod_id = eod_id        # >= 0: EOS inputs are not loss tokens (train.eod_mask_loss)
        self.loss_cell = loss_cell
        self.keep_state = keep_state
        cell.set_train(True)

    @property
    def loss_scale(self) -> Parameter:
        return self.step_cell.loss_scale

    @property
    def good_steps(self) -> Parameter:
        return self.step_cell.good_steps

    @property
    def accumulators(self):
        return self.step_cell.accumulators

    @property
    def micro_steps(self) -> int:
        return self.step_cell.micro_steps

    def count_tokens(self, input_ids: np.ndarray) -> int:
        return count_loss_tokens(input_ids, self.eod_id)

    def __call__(self, input_ids: np.ndarray, lr: float, tokens: int | None = None) -> StepResult:
        """`tokens`: the global batch's loss tokens (GlobalLossStep passes them); default: this batch's."""
        if tokens is None:
            tokens = self.count_tokens(input_ids)
        loss, overflow, norm, scale, z, spiked = self.cell(Tensor(input_ids), Tensor(lr, mstype.float32),
                                                           Tensor(float(tokens), mstype.float32))
        return StepResult(float(loss.asnumpy()), bool(overflow.asnumpy()),
                          float(norm.asnumpy().reshape(-1)[0]), float(scale.asnumpy()),
                          float(z.asnumpy()), bool(spiked.asnumpy()))

    def set_spike_limits(self, loss_limit: float, norm_limit: float) -> None:
        """The next steps skip their update when the loss or grad norm exceeds these (train.spike)."""
        self.step_cell.spike_limits.set_data(Tensor(np.array([loss_limit, norm_limit], np.float32)))

    def compile(self, batch_shape) -> None:
        """Compile the step graph without running it: under AutoParallel this slices the parameters,
        which a sharded checkpoint's per-rank tensors are then loaded into."""
        self.cell.compile(Tensor(np.zeros(batch_shape, np.int32)), Tensor(0.0, mstype.float32),
                          Tensor(1.0, mstype.float32))

    def state_parameters(self) -> dict[str, Parameter]:
        """Everything a checkpoint must hold: weights, AdamW moments and step, loss-scale state.
        The accumulators are rewritten from zero at every step, so they are not saved. With pipeline
        stages only this rank's stage (train.parallel.apply.stage_state_filter)."""
        return {p.name: p for p in self.step_cell.get_parameters()
                if not p.name.startswith(ACCU_PREFIX + ".") and p.name not in _CONSTANTS
                and p.name.rsplit(".", 1)[-1] not in _NOT_STATE
                and (self.keep_state is None or self.keep_state(p.name))}


def z_loss_reading(network: nn.Cell):
    """The z-loss reading Parameter of the loss cell inside `network` (None without z-loss)."""
    from mspretrain.train.step.loss import Z_VALUE
    for p in network.get_parameters():
        if p.name.rsplit(".", 1)[-1] == Z_VALUE:
            return p
    return None


def build_train_step(loss_net: nn.Cell, optimizer: nn.Optimizer, micro_steps: int, cfg,
                     network: nn.Cell | None = None, splits_batch: bool = False,
                     reduction: Reduction = Reduction()) -> TrainStep:
    """The TrainStep of `cfg` (precision, optim.clip_norm, train.accumulate) over `loss_net`, a
    CausalLMLoss (a "mean" one is replaced by its "sum" twin over the same model).
    `network`/`splits_batch`: a loss cell that splits the batch itself (a pipeline over the sum).
    `reduction`: how the ranks combine (one process: nothing)."""
    loss_net = summed_loss(loss_net)
    if network is None and micro_steps > 1 and accumulate_mode(cfg) == "split":
        network, splits_batch = split_cell(loss_net, micro_steps, cfg.device), True
    cell = TrainStepCell(network or loss_net, optimizer, micro_steps, cfg.optim.clip_norm,
                         cfg.precision.dtype == "fp16", cfg.precision.loss_scale,
                         loop=loops(cfg, micro_steps, splits_batch), splits_batch=splits_batch,
                         reduction=reduction, norm_by_dot=cfg.device != "Ascend")
    return TrainStep(cell, loss_net.eod_mask_id, loss_cell=loss_net)


def summed_loss(loss_net: nn.Cell) -> nn.Cell:
    """The loss cell the step differentiates: the sum of token losses (see the module docstring)."""
    if getattr(loss_net, "reduction", None) == "mean":
        return loss_net.summed()
    if getattr(loss_net, "reduction", None) != "sum":
        raise ValueError(f"the train step needs a CausalLMLoss, got {type(loss_net).__name__}")
    return loss_net
