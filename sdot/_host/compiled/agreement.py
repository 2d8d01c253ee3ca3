"""Which 3D cells their neighbours contradict: the vertices that two cells do not agree on.

A vertex of a power diagram (in general position) is the point where four cells meet, or
fewer and the box's sides: the vertex of cell ``i`` between its facets with ``a``, ``b`` and
``c`` is the vertex of cell ``a`` between its facets with ``i``, ``b`` and ``c``. A cell clipped
by too few seeds (:mod:`.cells3d`'s ring) keeps a vertex that some seed ``k`` should have cut off;
the cells of that vertex's facets that were clipped by ``k`` do not have it: the cell is
*contradicted*. So are the cells next to the error (they have a vertex with ``k`` that the
wrong cell lacks), and any cell at a vertex where more than four cells meet (their labels need
not agree): clipping those again is only wasted work, since the sum of the volumes stays the
certificate.

Vertices are compared by their labels alone: each cell's vertices as keys (the three labels,
sorted, as one integer), sorted, then each vertex looked up in the keys of the cell of one of
its facets (looking it up in all three found no more errors in 3D box solves at 1e5 seeds,
at three times the cost).
"""
from __future__ import annotations

import numpy as np

from ._numba import njit


@njit
def _key(a, b, c, base):
    """One integer for the set ``{a, b, c}`` of labels (>= -7): exact while ``base^3 < 2^63``;
    beyond, a hash whose collisions only hide a contradiction from this test."""
    if a > b:
        a, b = b, a
    if b > c:
        b, c = c, b
    if a > b:
        a, b = b, a
    return ((a + 7) * base + (b + 7)) * base + (c + 7)


@njit
def vertex_keys(first, last, corners, size, labels, offsets, keys, base):
    """The keys of the vertices of cells ``first .. last - 1``, sorted, into
    ``keys[offsets[i]:offsets[i + 1]]``."""
    for i in range(first, last):
        o = offsets[i]
        for v in range(size[i]):
            keys[o + v] = _key(labels[i, corners[i, v, 0]], labels[i, corners[i, v, 1]], labels[i, corners[i, v, 2]],
                               base)
        for v in range(o + 1, o + size[i]):       # insertion sort: a few tens of keys
            k, u = keys[v], v
            while u > o and keys[u - 1] > k:
                keys[u] = keys[u - 1]
                u -= 1
            keys[u] = k


@njit
def _has(keys, first, last, key):
    """Whether the sorted ``keys[first:last]`` hold ``key`` (bisection)."""
    end = last
    while first < last:
        mid = (first + last) // 2
        if keys[mid] < key:
            first = mid + 1
        else:
            last = mid
    return first < end and keys[first] == key


@njit
def contradicted_rows(first, last, corners, size, labels, offsets, keys, base, out):
    """``out[i]``: whether a vertex of cell ``i`` (``first <= i < last``) is missing from the
    cell of its first facet's seed (one of its three: the others are looked up from their own
    vertices, and an error has many vertices)."""
    for i in range(first, last):
        out[i] = False
        for v in range(size[i]):
            la = labels[i, corners[i, v, 0]]
            lb = labels[i, corners[i, v, 1]]
            lc = labels[i, corners[i, v, 2]]
            if la < 0:
                la, lb = lb, la
            if la < 0:
                la, lc = lc, la
            if la >= 0 and not _has(keys, offsets[la], offsets[la + 1], _key(i, lb, lc, base)):
                out[i] = True
                break


def contradicted(corners, size, labels, run_rows):
    """Whether each cell (the layout of :class:`..spatial.polyhedra.Cells`) has a vertex that a
    neighbour lacks (the module docstring); rows on the host's threads."""
    n = size.shape[0]
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(size, out=offsets[1:])
    keys = np.empty(max(int(offsets[-1]), 1), np.int64)
    base = n + 8
    run_rows(lambda first, last: vertex_keys(first, last, corners, size, labels, offsets, keys, base), n)
    out = np.empty(n, np.bool_)
    run_rows(lambda first, last: contradicted_rows(first, last, corners, size, labels, offsets, keys, base, out), n)
    return out
