"""dedup/components.py against scipy's connected components (an independent implementation)."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from mspretrain.dataprep.dedup.components import min_labels


def _scipy_min_labels(n: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    graph = coo_matrix((np.ones(len(a), np.int8), (a, b)), shape=(n, n))
    _, comp = connected_components(graph, directed=False)
    smallest = np.full(comp.max() + 1, n)
    np.minimum.at(smallest, comp, np.arange(n))
    return smallest[comp]


@pytest.mark.parametrize("n,edges,seed", [(1, 0, 0), (10, 0, 1), (50, 30, 2), (2000, 1500, 3),
                                          (2000, 4000, 4), (20000, 12000, 5)])
def test_labels_equal_scipys_components_by_their_smallest_node(n, edges, seed):
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, n, edges), rng.integers(0, n, edges)
    assert (min_labels(n, a, b) == _scipy_min_labels(n, a, b)).all()


def test_a_long_chain_in_any_order_is_one_component():
    n = 5000
    order = np.random.default_rng(6).permutation(n)
    a, b = order[:-1], order[1:]          # one path through every node, in shuffled order
    assert (min_labels(n, b, a) == 0).all()
