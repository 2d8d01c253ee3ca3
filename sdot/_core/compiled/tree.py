"""A balanced k-d tree of the seeds, with the largest weight under each node (numba).

The tree is implicit: node ``k`` has children ``2k + 1`` and ``2k + 2``; the leaves are the
nodes of the last level, each at most ``leaf + 1`` seeds. ``perm[start[k]:end[k]]`` are the
seeds under node ``k``, ``lo[k]``, ``hi[k]`` their box. The positions fix the tree; each set of
weights gives ``top[k]``, the largest weight under node ``k``: then no seed ``j`` under ``k``
has a smaller power ``|x - y_j|^2 - psi_j`` at ``x`` than ``dist(x, box_k)^2 - top[k]``, the
bound by which :mod:`.cells3d` skips whole subtrees.
"""
from __future__ import annotations

import numpy as np

from ._numba import njit


@njit
def levels(m, leaf):
    """The depth of the tree of ``m`` seeds with leaves of at most ``leaf + 1`` seeds."""
    depth = 0
    while (m >> depth) > leaf:
        depth += 1
    return depth


@njit(allocates=True)
def build(points, index, leaf):
    """The tree of ``points[index]`` (the seeds it holds): ``(perm, start, end, lo, hi)``,
    ``perm`` the entries of ``index`` in the order of the leaves."""
    m = index.shape[0]
    dim = points.shape[1]
    depth = levels(m, leaf)
    n_nodes = (1 << (depth + 1)) - 1
    first_leaf = (1 << depth) - 1
    perm = index.copy()
    start = np.zeros(n_nodes, np.int64)
    end = np.zeros(n_nodes, np.int64)
    lo = np.full((n_nodes, dim), np.inf)
    hi = np.full((n_nodes, dim), -np.inf)
    end[0] = m
    key = np.empty(m)
    for k in range(first_leaf):
        s, e = start[k], end[k]
        axis = 0
        widest = -1.0
        for a in range(dim):
            low, high = np.inf, -np.inf
            for t in range(s, e):
                x = points[perm[t], a]
                low = min(low, x)
                high = max(high, x)
            if e > s and high - low > widest:
                widest = high - low
                axis = a
        mid = (s + e) // 2
        if e - s > 1:
            for t in range(s, e):
                key[t] = points[perm[t], axis]
            _select(key, perm, s, e - 1, mid)
        start[2 * k + 1], end[2 * k + 1] = s, mid
        start[2 * k + 2], end[2 * k + 2] = mid, e
    for k in range(first_leaf, n_nodes):
        for t in range(start[k], end[k]):
            for a in range(dim):
                x = points[perm[t], a]
                lo[k, a] = min(lo[k, a], x)
                hi[k, a] = max(hi[k, a], x)
    for k in range(first_leaf - 1, -1, -1):
        for a in range(dim):
            lo[k, a] = min(lo[2 * k + 1, a], lo[2 * k + 2, a])
            hi[k, a] = max(hi[2 * k + 1, a], hi[2 * k + 2, a])
    return perm, start, end, lo, hi


@njit
def _select(key, perm, left, right, nth):
    """Reorder ``key[left:right + 1]`` (and ``perm`` with it) so that entry ``nth`` is the one
    a sort would put there, smaller ones before it and larger ones after (Hoare's selection)."""
    while right > left:
        pivot = key[(left + right) // 2]
        i, j = left, right
        while i <= j:
            while key[i] < pivot:
                i += 1
            while key[j] > pivot:
                j -= 1
            if i <= j:
                key[i], key[j] = key[j], key[i]
                perm[i], perm[j] = perm[j], perm[i]
                i += 1
                j -= 1
        if nth <= j:
            right = j
        elif nth >= i:
            left = i
        else:
            return


@njit(allocates=True)
def tops(perm, start, end, psi):
    """``top[k]``: the largest weight of the seeds under each node (``-inf`` under none)."""
    n_nodes = start.shape[0]
    first_leaf = (n_nodes - 1) // 2
    top = np.full(n_nodes, -np.inf)
    for k in range(first_leaf, n_nodes):
        for t in range(start[k], end[k]):
            top[k] = max(top[k], psi[perm[t]])
    for k in range(first_leaf - 1, -1, -1):
        top[k] = max(top[2 * k + 1], top[2 * k + 2])
    return top
