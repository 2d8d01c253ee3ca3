"""The entries of the Newton matrix from the cells' facets (numba, rows on the host's threads).

Per facet of cell ``i`` with seed ``j`` (``labels[i, k] = j >= 0``, ``k < count[i]``) and a
nonzero integral ``facet[i, k]`` of the density over it, the entry ``w = facet / (2 |y_j - y_i|)``
of the weighted Laplacian ``D - W`` (:mod:`..newton_matrix`); in 2D and 3D. In two passes
over the cells' slots instead of the array kernels' masks over every slot (at 1e5 3D cells of
48 slots: 110 ms a Newton step).
"""
from __future__ import annotations

import numpy as np

from ._numba import njit


@njit
def _counts(first, last, labels, count, facet, out):
    """``out[i]``: the facets of cell ``i`` with a seed and a nonzero integral."""
    for i in range(first, last):
        c = 0
        for k in range(count[i]):
            if labels[i, k] >= 0 and facet[i, k] != 0.0:
                c += 1
        out[i] = c


@njit
def _entries(first, last, seeds, labels, count, facet, offsets, rows, cols, w):
    """The entries of cells ``first .. last - 1`` from ``offsets[i]`` on, in slot order."""
    dim = seeds.shape[1]
    for i in range(first, last):
        o = offsets[i]
        for k in range(count[i]):
            j = labels[i, k]
            if j < 0 or facet[i, k] == 0.0:
                continue
            d2 = 0.0
            for a in range(dim):
                delta = seeds[j, a] - seeds[i, a]
                d2 += delta * delta
            rows[o] = i
            cols[o] = j
            w[o] = facet[i, k] / (2.0 * np.sqrt(d2))
            o += 1


def facet_entries(seeds, labels, count, facet):
    """``(rows, cols, w)`` of the cells' facets (NumPy in and out; see the module docstring),
    rows non-decreasing."""
    from . import run_rows

    n = labels.shape[0]
    seeds = np.ascontiguousarray(seeds, dtype=np.float64)
    labels = np.ascontiguousarray(labels, dtype=np.int64)
    count = np.ascontiguousarray(count, dtype=np.int64)
    facet = np.ascontiguousarray(facet, dtype=np.float64)
    per_cell = np.empty(n, np.int64)
    run_rows(lambda first, last: _counts(first, last, labels, count, facet, per_cell), n)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(per_cell, out=offsets[1:])
    m = int(offsets[-1])
    rows, cols, w = np.empty(m, np.int64), np.empty(m, np.int64), np.empty(m)
    run_rows(lambda first, last: _entries(first, last, seeds, labels, count, facet, offsets, rows, cols, w), n)
    return rows, cols, w
