"""The combinatorics of 3D power cells read off the regular triangulation (Qhull), on the host.

Each tetrahedron ``t`` of the regular triangulation of the seeds is, for each of its four
corners ``i``, a vertex of power cell ``i`` (the power centre of ``t``): the meeting point
of the facets of ``i`` with the three other corners ``a, b, c``. The vertex's edges are
dual to the triangles of ``t`` that hold ``i``: the edge opposite facet ``a`` (on the
facets ``b`` and ``c``) leads to the tetrahedron across the face ``(i, b, c)``, which is
the one opposite ``a`` in Qhull's ``neighbors``. So the cells need no clipping, only those
that reach beyond the box (clipped by its sides afterwards) and those of seeds on the
triangulation's hull, whose cells are unbounded (a tetrahedron missing across a face).

NumPy in, NumPy out (see :mod:`sdot._host`): integer arrays in the
layout of :mod:`sdot._core.spatial.polyhedra` (``labels``, ``count``, ``corners``,
``adjacent``, ``size``); the vertices are computed by the caller, in its own arrays.
"""
from __future__ import annotations

import numpy as np

from .triangulation import morton_order, nearest_pairs

#: Local corners ``(k + 1, k + 2, k + 3) % 4`` of a tetrahedron, the other three of corner k.
_OTHERS = (np.arange(4)[:, None] + np.arange(1, 4)[None, :]) % 4


def regular_tetrahedra(p, psi, active):
    """Tetrahedra ``(m, 4)`` of the regular triangulation of the ``active`` points ``p``
    (n, 3) with weights ``psi`` (Delaunay if None), as indices into ``p``, and their
    neighbours ``(m, 4)``: the tetrahedron opposite each corner, -1 if none (the hull, or a
    face of the lifted hull that is not lower). None if Qhull fails (degenerate inputs)."""
    from scipy.spatial import ConvexHull, Delaunay, QhullError

    keep = np.flatnonzero(active)
    keep = keep[morton_order(p[keep])]
    try:
        if psi is None:
            tri = Delaunay(p[keep])
            simplices, neighbours = tri.simplices, tri.neighbors
            lower = np.ones(len(simplices), bool)
        else:
            q = p[keep] - np.median(p[keep], axis=0)
            # Q5 Q8: no outer planes, no near-inside points (the same tetrahedra on random, lattice
            # and near-planar seeds; the lifted hull of 1e5 seeds 3.85 -> 3.30 s, means of 3)
            hull = ConvexHull(np.column_stack([q, np.sum(q * q, axis=1) - psi[keep]]), qhull_options="Qt Q5 Q8")
            simplices, neighbours = hull.simplices, hull.neighbors
            lower = hull.equations[:, 3] < 0
    except (QhullError, ValueError):
        return None
    index = np.where(lower, np.cumsum(lower) - 1, -1)
    tets = keep[simplices[lower]]
    across = neighbours[lower]
    across = np.where(across >= 0, index[np.maximum(across, 0)], -1)
    return tets.astype(np.int64), across.astype(np.int64)


def cell_combinatorics(p, psi, active, f_cap: int, v_cap: int, found=None, into=None):
    """The cells of the seeds ``p`` (n, 3) at weights ``psi`` from their regular
    triangulation (see the module docstring), in ``f_cap`` facet and ``v_cap`` vertex slots
    (``found``: that triangulation, :func:`regular_tetrahedra`, if made already).

    Returns
    -------
    None if Qhull fails, else a dict of NumPy arrays:
    labels (n, F), count (n,), corners (n, V, 3), adjacent (n, V, 3), size (n,)
        The layout of :class:`sdot._core.spatial.polyhedra.Cells` (neighbours in ascending
        order, no box side yet, ``-7`` padding), ``corners`` counter-clockwise seen from
        outside (from the seeds' positions: ``det(y_a - y_i, y_b - y_i, y_c - y_i) > 0``).
    open (n,)
        Cells of hull seeds (unbounded) and cells that do not fit the slots: to be built
        another way. Hidden and inactive seeds have ``size == count == 0`` and are not open.
    table (n, W)
        The neighbours of each seed, ascending, -1 padding (the rows of ``labels``).
    tetrahedra (m, 4), vertex (m, 4)
        The tetrahedra (seed indices) and where each is a vertex of each corner's cell:
        ``i V + slot`` (-1: an open cell's).

    ``into = (out, members, own)``: the cells of the seeds ``own`` (mask) only, written in
    the rows ``members[own]`` of the arrays ``out`` of that layout (``members``: the seeds'
    indices there, also those of the labels); the dict then holds only ``table`` (rows of the
    seeds ``own``) and ``vertex`` (the own seeds' entries), in ``members``' numbering.
    """
    n = len(p)
    found = regular_tetrahedra(p, psi, active) if found is None else found
    if found is None:
        return None
    tets, across = found
    m = len(tets)
    seed = tets.reshape(-1)                                     # entry e = 4 t + k: corner k of t
    size = np.bincount(seed, minlength=n)
    order = np.argsort(seed, kind="stable")                     # the entries by cell
    vslot = np.empty(4 * m, np.int64)
    vslot[order] = np.arange(4 * m) - np.repeat(np.cumsum(size) - size, size)
    # the other corners of each entry, counter-clockwise seen from outside its cell: the
    # cyclic (k + 1, k + 2, k + 3) when the tetrahedron's orientation times (-1)^k (a 4-cycle is
    # odd) is positive, else the last two swapped
    y = p[tets]
    e1, e2, e3 = y[:, 1] - y[:, 0], y[:, 2] - y[:, 0], y[:, 3] - y[:, 0]
    positive = np.einsum("ij,ij->i", e1, np.cross(e2, e3)) > 0
    flip = np.flatnonzero((positive[:, None] != (np.arange(4) % 2 == 0)[None, :]).reshape(-1))
    others = tets[:, _OTHERS].reshape(4 * m, 3)
    t_next = across[:, _OTHERS].reshape(4 * m, 3)
    for a in (others, t_next):
        a[flip, 1:] = a[flip, 2:0:-1]
    corners, row, col, degree = _facet_slots(seed, others, order, size, n)
    # edge q (opposite corner q) leads to the tetrahedron across the face without corner q
    missing = t_next < 0
    t_next = np.maximum(t_next, 0)
    k_next = _corner_of(tets.astype(np.int32)[t_next], seed.astype(np.int32)[:, None])
    adjacent = vslot[4 * t_next + k_next]
    bad_cells = np.bincount(seed, weights=missing.any(axis=1), minlength=n) > 0
    fits = (size <= v_cap) & (degree <= f_cap)
    open_ = bad_cells | ~fits
    dropped = np.flatnonzero(active & (size == 0))
    if psi is None and dropped.size and np.count_nonzero(active) > 1:
        # equal weights: no seed is hidden, so a seed in no tetrahedron (15 Diracs in a cluster
        # 1e-7 wide among 60: 5 of them) is Qhull's roundoff: it and its nearest seeds are
        # clipped from the box by each other
        extra = nearest_pairs(p, dropped, active)
        open_[extra[0]] = True
        pairs = np.unique(np.concatenate([row * n + col, extra[0] * n + extra[1]]))
        row, col = pairs // n, pairs % n
        degree = np.bincount(row, minlength=n)
    closed = ~open_
    if into is None:
        out = dict(labels=np.full((n, f_cap), -7, np.int64), count=np.zeros(n, np.int64),
                   corners=np.full((n, v_cap, 3), -1, np.int64), adjacent=np.zeros((n, v_cap, 3), np.int64),
                   size=np.zeros(n, np.int64), open=np.zeros(n, bool))
        members, own = np.arange(n), np.ones(n, bool)
    else:
        out, members, own = into
    rows = members[own]
    # scatter into the slots
    put = closed[seed]
    by_cell = order[(put & own[seed])[order]]                   # (writes in the order of the slots)
    at = members[seed[by_cell]] * v_cap + vslot[by_cell]
    out["corners"].reshape(-1, 3)[at] = corners[by_cell]
    out["adjacent"].reshape(-1, 3)[at] = adjacent[by_cell]
    slot = np.arange(row.size) - np.repeat(np.cumsum(degree) - degree, degree)
    fit_f = closed[row] & own[row]
    out["labels"][members[row[fit_f]], slot[fit_f]] = members[col[fit_f]]
    out["count"][rows] = np.where(closed, degree, 0)[own]
    out["size"][rows] = np.where(closed, size, 0)[own]
    out["open"][rows] = (open_ & (degree > 0))[own]
    local = np.cumsum(own) - 1                                  # the rows of the table
    width = max(int(degree.max(initial=0)), 1)
    table = np.full((int(own.sum()), width), -1, np.int64)
    mine = own[row]
    table[local[row[mine]], slot[mine]] = members[col[mine]]
    vertex = np.where(put & own[seed], members[seed] * v_cap + vslot, -1).reshape(m, 4)
    if into is None:
        return dict(out, table=table, tetrahedra=tets, vertex=vertex)
    return dict(table=table, vertex=vertex)


def _facet_slots(seed, others, order, size, n):
    """The facet slot of each of the three other corners ``others`` (4m, 3) of each entry in
    the cell of its corner ``seed`` (4m,): the rank of the neighbour among the cell's
    neighbours, ascending. ``order``: the entries by cell (stable), ``size``: entries per
    cell. Returns ``(slots (4m, 3), row, col, degree)``: the slots and the cells' neighbour
    pairs ``(row, col)`` by row, ascending, ``degree`` (n,) the neighbours per cell.

    A sort within each cell's about 80 references (scipy's CSR ``sort_indices``): 1.8 s by
    ``np.unique`` over all of them at 1e5 seeds, 0.6 s by rows."""
    import scipy.sparse as sp

    ref = (order[:, None] * 3 + np.arange(3)[None, :]).reshape(-1)      # references by cell
    count = 3 * size
    indptr = np.concatenate([[0], np.cumsum(count)])
    by_row = sp.csr_matrix((ref, others.reshape(-1)[ref], indptr), shape=(n, n))
    by_row.has_sorted_indices = False
    by_row.sort_indices()
    col, ref = by_row.indices.astype(np.int64, copy=False), by_row.data
    row = np.repeat(np.arange(n), count)
    first = np.ones(col.size, bool)
    first[1:] = (col[1:] != col[:-1]) | (row[1:] != row[:-1])
    pairs = np.cumsum(first)
    unique = pairs - 1                                          # the pair of each reference
    start = pairs[np.maximum(indptr[:-1] - 1, 0)] * (indptr[:-1] > 0)     # pairs before each row
    slots = np.empty(col.size, np.int64)
    slots[ref] = unique - start[row]
    degree = np.bincount(row[first], minlength=n)
    return slots.reshape(-1, 3), row[first], col[first], degree


def _corner_of(tets, seed):
    """The corner (0 to 3) of each of the tetrahedra ``tets`` (..., 4) that is ``seed``
    (broadcast against ``tets[..., 0]``)."""
    return ((tets[..., 1] == seed) * 1 + (tets[..., 2] == seed) * 2 + (tets[..., 3] == seed) * 3).astype(np.int64)

