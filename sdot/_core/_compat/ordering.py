"""Fill-reducing ordering of the Newton matrix from the positions of the seeds.

The Newton matrix is a weighted Laplacian of the power diagram's adjacency: a
planar graph whose vertices are the seeds. On such graphs a nested dissection
(order two halves first, then the few rows that separate them) gives factors
whose cost grows like ``n^1.5``. The seeds' positions give the halves directly.
"""
from __future__ import annotations

import numpy as np

#: Parts of at most this many rows are not split further (measured on Delaunay
#: Laplacians at 1e5 rows: factorisation 0.42 s with parts of 8, 0.64 s with 32).
LEAF = 8


def nested_dissection(points, indptr, indices, leaf=LEAF):
    """Permutation ``perm`` of the rows of a sparse symmetric matrix (CSR pattern
    ``indptr, indices``, one row per point of ``points`` (n, dim), NumPy) such that
    ``A[perm][:, perm]`` factors with little fill.

    The dissection tree halves the rank of one coordinate per level (coordinates
    in turn), so each level splits every part near its median, down to parts of
    about ``leaf`` rows: a row's path in the tree is the Morton code of its
    coordinates' ranks. An edge whose ends part at level ``s`` makes its lower end
    a separator of that level or above (the highest such): separators come after
    both halves of their part. The order is the tree's post-order: a base-3 digit
    per level (0 lower half, 1 upper half, 2 separator), rows sorted by them.
    """
    n, dim = points.shape
    levels = int(np.ceil(np.log2(n / leaf))) if n > leaf else 0
    bits = -(-levels // dim)                  # per coordinate
    path = np.zeros(n, dtype=np.int64)
    for c in range(dim):
        rank = np.empty(n, dtype=np.int64)
        rank[np.argsort(points[:, c])] = np.arange(n)
        cell = (rank << bits) // n            # the coordinate's rank in 2**bits slices
        for k in range(bits):                 # bit k of the cell -> level (bits - 1 - k) * dim + c
            level = (bits - 1 - k) * dim + c
            if level < levels:
                path |= ((cell >> k) & 1) << (levels - 1 - level)
    length = np.diff(indptr)
    mine, theirs = np.repeat(path, length), path[indices]
    parting = np.frexp((mine ^ theirs).astype(np.float64))[1]   # top bit where the paths differ
    level = np.where(mine < theirs, levels - parting, levels)  # where this row is the lower end
    separated = np.full(n, levels, dtype=np.int64)             # separator level, or levels
    if level.size:
        separated[length > 0] = np.minimum.reduceat(level, indptr[:-1][length > 0])
    key = np.zeros(n, dtype=np.int64)
    for s in range(levels):
        digit = np.where(separated == s, 2, (path >> (levels - 1 - s)) & 1)
        key += np.where(separated >= s, digit, 0) * 3 ** (levels - 1 - s)
    return np.argsort(key, kind="stable")
