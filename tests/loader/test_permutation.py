"""Order: epoch permutations are bijections of [0, N), random access, keyed by (seed, stream, epoch)."""
import numpy as np
import pytest

from mspretrain.loader.permutation import FeistelPermutation, derive_keys, epoch_permutation


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 16, 17, 97, 256, 1000, 1024, 4099])
def test_every_epoch_is_a_bijection(n):
    for seed, epoch in [(0, 0), (1, 0), (0, 5)]:
        values = epoch_permutation(n, seed, 0, epoch).take(np.arange(n))
        assert values.dtype == np.int64
        assert np.array_equal(np.sort(values), np.arange(n))


def test_scalar_and_vector_access_agree():
    perm = epoch_permutation(1000, 3, 0, 2)
    positions = np.array([999, 0, 500, 3, 3])
    assert [perm[int(i)] for i in positions] == perm.take(positions).tolist()
    assert perm.take(np.arange(12).reshape(3, 4)).shape == (3, 4)


def test_order_depends_on_seed_epoch_and_stream_only():
    n = 1000
    base = epoch_permutation(n, 7, 0, 0).take(np.arange(n))
    assert np.array_equal(base, epoch_permutation(n, 7, 0, 0).take(np.arange(n)))   # pure function
    for other in [epoch_permutation(n, 8, 0, 0), epoch_permutation(n, 7, 0, 1),
                  epoch_permutation(n, 7, 1, 0)]:
        values = other.take(np.arange(n))
        assert np.mean(values == base) < 0.02        # about 1/n agree by chance


def test_orders_look_random():
    n = 4096
    values = epoch_permutation(n, 0, 0, 0).take(np.arange(n)).astype(float)
    positions = np.arange(n, dtype=float)
    assert abs(np.corrcoef(positions, values)[0, 1]) < 0.1
    ascending = np.mean(np.diff(values) > 0)
    assert 0.45 < ascending < 0.55                    # a random order rises half the time
    assert np.sum(values == positions) < 10           # fixed points: Poisson(1) expected
    # neighbours in the order come from all over the range, not from a local block
    assert np.median(np.abs(np.diff(values))) > n / 8


def reduced_chi_square(a, b, bins=16):
    """Independence of two bucket labels in [0, bins): about 1 when independent, far above if not."""
    table = np.zeros((bins, bins))
    np.add.at(table, (a, b), 1)
    expected = np.outer(table.sum(1), table.sum(0)) / table.sum()
    return ((table - expected) ** 2 / expected).sum() / (bins - 1) ** 2


@pytest.mark.parametrize("n", [4096, 20_000, 1_000_003])
def test_position_value_and_epoch_pairs_are_independent(n):
    positions = np.arange(n)
    values = epoch_permutation(n, 3, 0, 0).take(positions)
    next_epoch = epoch_permutation(n, 3, 0, 1).take(positions)
    def high(x):
        return x * 16 // n
    assert reduced_chi_square(high(positions), high(values)) < 1.6        # top bits of i vs p(i)
    assert reduced_chi_square(positions % 16, values % 16) < 1.6          # low bits of i vs p(i)
    assert reduced_chi_square(high(values[:-1]), high(values[1:])) < 1.6  # consecutive samples
    assert reduced_chi_square(high(values), high(next_epoch)) < 1.6       # epoch e vs e + 1
    assert reduced_chi_square(high(positions), high(positions)) > 100     # the statistic can fail


def test_huge_split_is_random_access_without_an_index():
    n = 10 ** 10
    perm = epoch_permutation(n, 1, 0, 0)
    positions = np.array([0, 1, n // 2, n - 2, n - 1] + list(range(10 ** 7, 10 ** 7 + 1000)))
    values = perm.take(positions)
    assert values.min() >= 0 and values.max() < n
    assert np.unique(values).size == positions.size   # distinct positions give distinct samples
    assert perm.domain_bits == 34                     # the domain is 2^34 >= 10^10, nothing per sample


def test_bad_arguments():
    with pytest.raises(ValueError):
        FeistelPermutation(0, derive_keys(1))
    with pytest.raises(IndexError):
        epoch_permutation(10, 0, 0, 0).take(np.array([10]))
    with pytest.raises(IndexError):
        epoch_permutation(10, 0, 0, 0).take(np.array([-1]))
