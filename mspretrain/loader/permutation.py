"""Random-access permutations of [0, N): a keyed Feistel network with cycle-walking.

Epoch e of a stream is the bijection `epoch_permutation(n, seed, stream, e)`. Any position is
computed in O(1) time and memory (no index array), so a 10^10-sample split opens instantly and
resuming at cursor 10^7 costs the same as starting at 0.

The network permutes the domain [0, 2^b), the smallest power of two >= N (b >= 2): a value is split
into a high part of ceil(b/2) bits and a low part of floor(b/2) bits, and each of the ROUNDS rounds
XORs one part with a keyed hash of the other (alternating), which is invertible whatever the hash.
A value that lands outside [0, N) is permuted again until it falls inside (cycle-walking); this
restricts the bijection of [0, 2^b) to a bijection of [0, N), with fewer than two passes on average.
"""
from __future__ import annotations

import hashlib
import struct

import numpy as np

ROUNDS = 8          # half-rounds: 4 full Feistel rounds
_ONE = np.uint64(1)


def derive_keys(*parts: object, count: int = ROUNDS) -> np.ndarray:
    """`count` 64-bit round keys from a hash of `parts` (for example seed, stream, epoch)."""
    text = ":".join(str(p) for p in parts).encode()
    digest = hashlib.blake2b(text, digest_size=8 * count, person=b"loader.perm").digest()
    return np.array(struct.unpack(f"<{count}Q", digest), dtype=np.uint64)


def _round(x: np.ndarray, key: np.uint64, bits: np.uint64) -> np.ndarray:
    """Keyed multiply-shift hash of x to `bits` bits: the top bits of a 64-bit product depend on
    every input bit (the bottom bits would not). Three array operations: this runs per round."""
    return ((x ^ key) * (key | _ONE)) >> bits


class FeistelPermutation:
    """A bijection of [0, n) given by `keys`; `self[i]` or `self.take(array)` maps positions to values."""

    def __init__(self, n: int, keys: np.ndarray):
        if n < 1:
            raise ValueError(f"permutation of an empty range (n={n})")
        if n > 1 << 62:
            raise ValueError(f"n={n} too large (at most 2^62)")
        self.n = int(n)
        self.domain_bits = max(2, int(n - 1).bit_length())
        self.low_bits = self.domain_bits // 2
        self.keys = np.asarray(keys, dtype=np.uint64)

    def __getitem__(self, i: int) -> int:
        return int(self.take(np.array([i], dtype=np.int64))[0])

    def take(self, positions: np.ndarray) -> np.ndarray:
        """Values at `positions` (int array, each in [0, n)), as int64."""
        x = np.asarray(positions, dtype=np.int64)
        if x.size and (x.min() < 0 or x.max() >= self.n):
            raise IndexError(f"positions out of range [0, {self.n})")
        y = self._network(x.astype(np.uint64).ravel())
        limit = np.uint64(self.n)
        outside = np.flatnonzero(y >= limit)
        while outside.size:
            y[outside] = self._network(y[outside])
            outside = outside[y[outside] >= limit]
        return y.astype(np.int64).reshape(x.shape)

    def _network(self, x: np.ndarray) -> np.ndarray:
        shift = np.uint64(self.low_bits)
        to_low, to_high = np.uint64(64 - self.low_bits), np.uint64(64 - self.domain_bits + self.low_bits)
        high, low = x >> shift, x & np.uint64((1 << self.low_bits) - 1)
        for r, key in enumerate(self.keys):
            if r % 2 == 0:
                low ^= _round(high, key, to_low)
            else:
                high ^= _round(low, key, to_high)
        return (high << shift) | low


def epoch_permutation(n: int, seed: int, stream: object, epoch: int) -> FeistelPermutation:
    """The order of epoch `epoch` of stream `stream` (a source index) under `seed`."""
    return FeistelPermutation(n, derive_keys("epoch", seed, stream, epoch))
