"""The layers every model family builds from, so that the trainer's precision and parallel plans find
what they address: `Dense` (a bias-free nn.Dense with precision O2's held casts), `dense` (one drawn
from a numpy generator) and `RMSNorm` (fp32 inside, its primitives held). A family's weight matmuls
must be `Dense`, not mindspore's plain nn.Dense: O2 casts their input and weight with the held
`cast_x` / `cast_w`, and the plan gives those casts strategies (docs/extending.md)."""
from __future__ import annotations

import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common import dtype as mstype
# not re-exported by mindspore.ops in 2.10 as a class (ops.rms_norm is its functional form)
from mindspore.ops.auto_generate.gen_ops_prim import RmsNorm


class Dense(nn.Dense):
    """nn.Dense without bias whose matmul can run in a compute dtype (precision O2, set_compute_dtype):
    the input and the fp32 master weight are cast by held `Cast` primitives that the plan shards like
    the matmul's inputs (MindFormers' Linear). With no compute dtype (fp32, O1's to_float) its
    construct is nn.Dense's, unchanged."""

    def __init__(self, d_in: int, d_out: int, weight_init):
        super().__init__(d_in, d_out, weight_init=weight_init, has_bias=False)
        self.compute_dtype = None
        self.cast_x, self.cast_w = ops.Cast(), ops.Cast()

    def construct(self, x):
        x_shape = self.shape_op(x)
        if len(x_shape) != 2:
            x = self.reshape(x, (-1, x_shape[-1]))
        if self.compute_dtype is None:
            x = self.matmul(x, self.weight)
        else:
            x = self.matmul(self.cast_x(x, self.compute_dtype), self.cast_w(self.weight, self.compute_dtype))
        if len(x_shape) != 2:
            x = self.reshape(x, x_shape[:-1] + (ops.shape(x)[-1],))
        return x


def dense(rng: np.random.Generator, d_in: int, d_out: int, std: float) -> Dense:
    """A Dense [d_out, d_in] whose weight is drawn N(0, std) from `rng` (so from the model's seed only)."""
    w = rng.normal(0.0, std, size=(d_out, d_in)).astype(np.float32)
    return Dense(d_in, d_out, weight_init=Tensor(w))


class RMSNorm(nn.Cell):
    """x / rms(x) * weight, computed in fp32 whatever the input precision. `fused`: the same in one
    Ascend kernel (MindSpore's RmsNorm, models/fused.py), its fp32 input and weight cast as here."""

    def __init__(self, dim: int, eps: float, fused: bool = False):
        super().__init__()
        self.weight = Parameter(Tensor(np.ones(dim, np.float32)), name="weight")
        self.eps = eps
        self.fused = fused
        # primitives held so that train.parallel.apply can give each one a strategy
        self.cast_in, self.cast_out, self.cast_weight = ops.Cast(), ops.Cast(), ops.Cast()
        if fused:
            self.rms_norm = RmsNorm(eps)
        else:
            self.square, self.mean = ops.Square(), ops.ReduceMean(keep_dims=True)
            self.add_eps, self.rsqrt, self.normalize = ops.Add(), ops.Rsqrt(), ops.Mul()
            self.scale = ops.Mul()

    def construct(self, x):
        xf = self.cast_in(x, mstype.float32)
        w = self.cast_weight(self.weight, mstype.float32)
        if self.fused:
            return self.cast_out(self.rms_norm(xf, w)[0], x.dtype)
        var = self.mean(self.square(xf), -1)
        y = self.normalize(xf, self.rsqrt(self.add_eps(var, self.eps)))
        return self.cast_out(self.scale(y, w), x.dtype)


def set_dense_compute_dtype(model: nn.Cell, dtype) -> None:
    """Precision O2 for every weight matmul of `model`: each Dense computes in `dtype`. A plain
    mindspore nn.Dense has no held casts to take the dtype (nor the plan's strategies): an error
    naming it, rather than a matmul of mixed dtypes or a plan that does not find its casts."""
    plain = [name for name, cell in model.cells_and_names()
             if isinstance(cell, nn.Dense) and not isinstance(cell, Dense)]
    if plain:
        raise TypeError(plain_dense_message(plain))
    for _, cell in model.cells_and_names():
        if isinstance(cell, Dense):
            cell.compute_dtype = dtype


def plain_dense_message(names: list) -> str:
    return (f"layer {', '.join(names)} is a plain mindspore.nn.Dense: a model family's weight matmuls "
            f"must be mspretrain.train.models.layers.Dense (bias-free, with precision O2's casts cast_x "
            f"and cast_w, which the parallel plan shards; docs/extending.md)")
