"""Fill-reducing ordering of the Newton matrix from the positions of the seeds.

The Newton matrix is a weighted Laplacian of the power diagram's adjacency: a
planar graph whose vertices are the seeds. On such graphs a nested dissection
(order two halves first, then the few rows that separate them) gives factors
whose cost grows like ``n^1.5``. The seeds' positions give the halves directly.
"""
from __future__ import annotations

import numpy as np

#: Parts of about this many rows are not split further (measured on a Delaunay
#: Laplacian at 1e5 rows, parts of 4, 8, 16, 32: fill 69 to 73 per row, factorisation
#: 0.37 to 0.43 s, no clear best).
LEAF = 8


def nested_dissection(points, indptr, indices, leaf=LEAF):
    """Permutation ``perm`` of the rows of a sparse symmetric matrix (CSR pattern
    ``indptr, indices``, each edge in the rows of both its ends; one row per point of
    ``points`` (n, dim), NumPy) such that ``A[perm][:, perm]`` factors with little
    fill. Any pattern gives a permutation; an asymmetric one only more fill.

    The dissection tree halves the rank of one coordinate per level (coordinates
    in turn), so each level splits every part near its median, down to parts of
    about ``leaf`` rows: a row's path in the tree is the Morton code of its
    coordinates' ranks. Of an edge whose ends part at level ``s``, the end with
    more such edges is a separator of that level or above (the highest such): a
    greedy cover of the edges across the cut (measured at 1e5 rows: fill 68 per row
    instead of 84 with always the lower end; at 1e6 90 instead of 112, factorisation
    7.1 instead of 10.2 s). Separators come after both halves of their part. The
    order is the tree's post-order: a base-3 digit per level (0 lower half, 1 upper
    half, 2 separator), rows sorted by them.
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
    rows = np.repeat(np.arange(n), length)
    mine, theirs = path[rows], path[indices]
    level = np.where(mine != theirs, levels - np.frexp((mine ^ theirs).astype(np.float64))[1], levels)
    # each end's count of edges parting at that level (one count of (row, level) pairs)
    count = np.bincount(rows * (levels + 1) + level, minlength=n * (levels + 1))
    degree, other = count[rows * (levels + 1) + level], count[indices * (levels + 1) + level]
    # the end with more such edges separates (a greedy cover of the edges across the cut)
    chosen = (degree > other) | ((degree == other) & (mine < theirs))
    separated = np.full(n, levels, dtype=np.int64)             # separator level, or levels
    if level.size:
        separated[length > 0] = np.minimum.reduceat(np.where(chosen, level, levels), indptr[:-1][length > 0])
    key = np.zeros(n, dtype=np.int64)
    for s in range(levels):
        digit = np.where(separated == s, 2, (path >> (levels - 1 - s)) & 1)
        key += np.where(separated >= s, digit, 0) * 3 ** (levels - 1 - s)
    return np.argsort(key, kind="stable")
