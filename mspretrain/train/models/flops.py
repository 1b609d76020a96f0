"""A model's size for the step metrics (the parameter count, MFU's FLOPs per token), whatever its
family: the count is of the built cell's parameters, the FLOPs a decoder's from its dimensions."""
from __future__ import annotations

import numpy as np


def count_params(model) -> int:
    """The number of parameters of the nn.Cell `model` (every weight, trainable or not)."""
    return int(sum(np.prod(p.shape) for p in model.get_parameters()))


def flops_per_token(args, num_params: int) -> float:
    """Training FLOPs per token of a decoder-only transformer: 6 * params (matmuls, forward + backward)
    plus the attention scores and weighted sum, 12 * layers * hidden * seq (PaLM appendix B). Embedding
    lookups are not matmuls. `args`: the family's model arguments, with vocab_size, hidden_size,
    num_layers, seq_length and tie_embeddings (as Llama's ModelArgs)."""
    matmul_params = num_params - (0 if args.tie_embeddings else args.vocab_size * args.hidden_size)
    return 6.0 * matmul_params + 12.0 * args.num_layers * args.hidden_size * args.seq_length
