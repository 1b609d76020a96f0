"""Blending: a deterministic, periodic, error-minimising schedule with O(1) lookups."""
import numpy as np
import pytest

from mspretrain.loader.blend import MAX_WINDOW_ERROR, PERIOD, BlendSchedule, quantise

CASES = [[1, 1], [1, 3], [0.7, 0.2, 0.1], [5, 1, 1, 1, 2], [1, 2], [0.999, 0.001], list(range(1, 21))]


@pytest.mark.parametrize("weights", CASES)
def test_quantised_counts_sum_to_the_period(weights):
    counts = quantise(weights)
    assert counts.sum() == PERIOD and counts.min() >= 1
    w = np.asarray(weights) / np.sum(weights)
    assert np.max(np.abs(counts / PERIOD - w)) <= 1 / PERIOD


@pytest.mark.parametrize("weights", CASES)
def test_every_window_is_within_the_documented_tolerance(weights):
    schedule = BlendSchedule(weights)
    w = schedule.weights
    start = 123_456                            # across a period boundary too
    sources, numbers = schedule.locate(np.arange(start, start + 3 * PERIOD))
    for j in range(len(weights)):
        counts = np.concatenate([[0], np.cumsum(sources == j)])
        for length in (1000, 3000):
            window = counts[length:] - counts[:-length]
            assert np.max(np.abs(window - length * w[j])) <= MAX_WINDOW_ERROR + length / PERIOD
        # against the requested (unquantised) weights the error stays tiny too
        assert abs(counts[-1] / (3 * PERIOD) - weights[j] / sum(weights)) < 1e-4


@pytest.mark.parametrize("weights", CASES)
def test_each_source_stream_is_consumed_in_order_without_gaps(weights):
    schedule = BlendSchedule(weights)
    sources, numbers = schedule.locate(np.arange(0, 2 * PERIOD + 777))
    for j in range(len(weights)):
        assert np.array_equal(numbers[sources == j], np.arange(np.sum(sources == j)))


def test_lookup_is_pure_and_random_access():
    schedule = BlendSchedule([0.5, 0.3, 0.2])
    positions = np.array([10 ** 12, 7, 10 ** 7 + 3, 7])
    s1, n1 = schedule.locate(positions)
    s2, n2 = BlendSchedule([0.5, 0.3, 0.2]).locate(positions[::-1])
    assert np.array_equal(s1, s2[::-1]) and np.array_equal(n1, n2[::-1])
    assert n1[0] == pytest.approx(10 ** 12 * 0.5, rel=1e-4)


@pytest.mark.parametrize("bad", [[], [1, 0], [1, -2], [float("nan")], [float("inf"), 1]])
def test_bad_weights(bad):
    with pytest.raises(ValueError, match="weights"):
        quantise(bad)
