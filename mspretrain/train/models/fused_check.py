"""The doctor's "fused kernels" rung (Ascend): each fused kernel's layer (models/fused.py) against the
composed one it replaces, on fixed fp32 tensors. A module of its own: it builds the model's layers,
which themselves pick their kernels from models/fused.py."""
from __future__ import annotations

# fp32, u = 2**-24. The widest reduction is RMSNorm's mean of H = 128 squares: two summation orders
# differ by at most H*u relative (sequential bound), rsqrt halves it; rotary is 3 roundings per element,
# SwiGLU's sigmoid a few ulps of exp. Backward repeats the same reductions once more: 2 * H * u = 2**-16,
# relative to the largest magnitude of the composed layer's output (or gradient).
FUSED_TOLERANCE = 2 * 128 * 2.0 ** -24


def compare_with_composed(device: str = "Ascend") -> str:
    """Each fused kernel's layer against the composed one on fixed fp32 tensors, forward and the input
    gradient (and the norm's weight gradient). Returns "" or what differs (one line per kernel)."""
    import mindspore as ms
    import numpy as np
    from mindspore import Tensor

    from mspretrain.train.models.layers import RMSNorm
    from mspretrain.train.models.llama.model import MLP, ModelArgs, Rotary

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device(device)
    rng = np.random.default_rng(0)
    b, s, h, n = 2, 32, 128, 4
    args = dict(vocab_size=64, seq_length=s, hidden_size=h, num_heads=n, ffn_size=256)
    pairs = {
        "rms_norm": (RMSNorm(h, 1e-5, fused=True), RMSNorm(h, 1e-5), (b, s, h)),
        "rope": (Rotary(s, h // n, 1e4, fused=True), Rotary(s, h // n, 1e4), (b, n, s, h // n)),
        "swiglu": (MLP(ModelArgs(**args, fused_kernels=("swiglu",)), np.random.default_rng(1), 0.02),
                   MLP(ModelArgs(**args), np.random.default_rng(1), 0.02), (b, s, h)),
    }
    problems = []
    for name, (fused, plain, shape) in pairs.items():
        x = Tensor(rng.standard_normal(shape).astype(np.float32))
        outs = []
        for cell in (fused, plain):
            weights = cell.trainable_params() or None
            fn = ms.value_and_grad(lambda t, c=cell: (c(t) * c(t)).sum() / 2,   # backward sees y itself
                                   grad_position=0, weights=weights)
            _, grads = fn(x)
            flat = grads if weights is None else (grads[0], *grads[1])
            outs.append([cell(x).asnumpy(), *[g.asnumpy() for g in flat]])
        for what, a, ref in zip(("output", "input gradient", "weight gradient"), *outs):
            bound = FUSED_TOLERANCE * float(np.abs(ref).max())
            worst = float(np.abs(a - ref).max())
            if worst > bound:
                problems.append(f"{name} {what} differs from the composed layer by {worst:.3e} > {bound:.3e}")
    return "; ".join(problems)
