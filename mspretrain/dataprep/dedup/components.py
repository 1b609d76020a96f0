"""Connected components of an undirected graph given as edge arrays, in numpy alone.

Every node ends up labelled by the smallest node of its component. Hooking and pointer jumping:
each round points the root of one end of every edge at the smaller root of the two, then follows
pointers until every node points at a root. A node only ever points at a smaller node, so there
are no cycles; the smallest node of a component is never pointed away, so it is the root that the
whole component ends up at. Rounds: about log2 of the longest path, in practice a handful."""
from __future__ import annotations

import numpy as np


def min_labels(n: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """For nodes 0..n-1 and edges (a[i], b[i]): the smallest node of each node's component."""
    parent = np.arange(n, dtype=np.int64)
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    while True:
        ra, rb = parent[a], parent[b]
        if np.array_equal(ra, rb):
            return parent
        low = np.minimum(ra, rb)
        np.minimum.at(parent, ra, low)
        np.minimum.at(parent, rb, low)
        while True:
            grand = parent[parent]
            if np.array_equal(grand, parent):
                break
            parent = grand
