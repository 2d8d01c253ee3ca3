"""Neighbours on the host: k nearest (cKDTree), Delaunay and regular triangulations (Qhull).

NumPy in, NumPy out (see :mod:`sdot._host`); :mod:`sdot._core.seed_neighbours`
calls these on NumPy views and has the array-API fallbacks.
"""
from __future__ import annotations

import numpy as np

from .threads import map_on_threads, settings

#: The dtype of the neighbour tables and indices these functions return.
INDEX = np.int64

#: Nearest points taken as candidates for a point in no Delaunay triangle.
LONELY_NEIGHBOURS = 8
#: Nearest points taken for a point Qhull leaves out of a triangulation within its roundoff
#: (they are together: of 50 Diracs in a cluster 1e-9 wide, with 24 the cells were not
#: certified, with 64 they were).
DROPPED_NEIGHBOURS = 64
#: Depth of each tile's points beyond its sides, in mean spacings of the points.
TILE_OVERLAP = 8
#: Active points from which :func:`tiled_rings` makes at least one tile per thread (Qhull
#: releases the GIL; measured on 1e4 uniform points: 30 ms in one piece, 17 ms in two
#: halves on two threads; in a later session 36 and 24 ms, minima of 15 calls).
TILED_FROM = 4_000


def k_nearest(points, k: int):
    """Indices ``(n, k)`` of the ``k`` nearest ``points`` of each point (itself first)."""
    from scipy.spatial import cKDTree

    return np.asarray(cKDTree(points).query(points, k=k, workers=-1)[1], dtype=np.int64).reshape(len(points), k)


def nearest(points, queries):
    """Index ``(m,)`` of the nearest of ``points`` to each of ``queries``."""
    from scipy.spatial import cKDTree

    return np.asarray(cKDTree(points).query(queries, k=1, workers=-1)[1], dtype=np.int64).reshape(len(queries))


def fixed_width_table(points, width: int, weights=None, active=None):
    """The first ``width`` neighbours of each point, -1 padding: in the Delaunay triangulation
    (:func:`delaunay_table`), or with ``weights`` (and ``active``) in the regular triangulation
    of the active points where it gives any (:func:`with_regular_rows`)."""
    table = delaunay_table(points)
    if weights is not None:
        table = with_regular_rows(table, regular_table(points, weights, active))
    table = table[:, :width]
    return np.pad(table, ((0, 0), (0, width - table.shape[1])), constant_values=-1)


def delaunay_table(host):
    """Neighbours of each of the points ``host`` in their Delaunay triangulation, ``(n, W)``,
    -1 padding; points in no triangle (duplicates, collinear inputs) get their
    :data:`LONELY_NEIGHBOURS` nearest points instead (and, all collinear, those on either side)."""
    table = regular_table(host)
    lonely = np.flatnonzero(table[:, 0] < 0)
    if lonely.size and len(host) > 1:
        from scipy.spatial import cKDTree

        # (collinear inputs have no triangle at all: their cells are strips, cut by the
        # neighbours on either side, which a few nearest points include)
        k = min(max(table.shape[1], LONELY_NEIGHBOURS) + 1, len(host))
        near = np.asarray(cKDTree(host).query(host[lonely], k=k)[1]).reshape(lonely.size, k)
        table = np.pad(table, ((0, 0), (0, max(k + 1 - table.shape[1], 0))), constant_values=-1)
        table[lonely, :k - 1] = near[:, 1:]
        if lonely.size == len(host):        # no triangle: collinear, or duplicates of collinear points
            order = np.argsort(host @ principal_direction(host), kind="stable")
            before, after = np.roll(order, 1), np.roll(order, -1)
            before[0], after[-1] = order[0], order[-1]
            table[order, k - 1], table[order, k] = before, after
    return table


def with_regular_rows(table, regular):
    """``table`` with the rows that have neighbours in ``regular`` (None: Qhull failed)
    replaced by them."""
    if regular is None:
        return table
    width = max(table.shape[1], regular.shape[1])
    table, regular = (np.pad(t, ((0, 0), (0, width - t.shape[1])), constant_values=-1) for t in (table, regular))
    return np.where(regular[:, :1] >= 0, regular, table)


def principal_direction(p):
    """The direction of largest spread of the points ``p`` (their line, if collinear)."""
    centred = p - p.mean(axis=0)
    return np.linalg.svd(centred, full_matrices=False)[2][0]


def regular_table(p, psi=None, active=None):
    """Neighbours of each ``active`` point (default all) in the regular triangulation of
    the points ``p`` with weights ``psi`` (Delaunay if None), ``(n, W)``, -1 padding; rows
    of hidden and inactive points all -1. None if Qhull fails with weights (an empty
    table without)."""
    from scipy.spatial import QhullError

    n = len(p)
    keep = np.arange(n) if active is None else np.flatnonzero(active)
    try:
        order, tri = lower_triangles(p, psi, keep)  # vertical facets: harmless here
        tri = order[tri]
    except (QhullError, ValueError):                # too few points, all collinear or coplanar
        if psi is not None:
            return None
        tri = np.zeros((0, p.shape[1] + 1), np.int64)
    corners = tri.shape[1]                          # 3 in 2D (triangles), 4 in 3D (tetrahedra)
    a = np.concatenate([tri[:, i] for i in range(corners) for j in range(i + 1, corners)])
    b = np.concatenate([tri[:, j] for i in range(corners) for j in range(i + 1, corners)])
    pairs = np.sort(np.concatenate([a * n + b, b * n + a]))
    pairs = pairs[np.concatenate([pairs[:1] >= 0, pairs[1:] != pairs[:-1]])]
    row, col = pairs // n, pairs % n
    degree = np.bincount(row, minlength=n)
    table = -np.ones((n, max(int(degree.max(initial=0)), 1)), dtype=np.int64)
    table[row, np.arange(row.size) - np.repeat(np.cumsum(degree) - degree, degree)] = col
    return table


def tiled_rings(p, psi, active, stop_if_hidden=False, *, tile_points: int):
    """The rings of :func:`rings` (each active point's neighbours in the regular
    triangulation, counter-clockwise), computed in tiles of at most about ``tile_points``
    active points, at least one per thread, from :data:`TILED_FROM` points.

    The tiles split the points into slabs of equal counts along the first coordinate,
    then each slab along the second; each tile is triangulated with the points up to
    :data:`TILE_OVERLAP` mean spacings beyond its sides, on the threads, and each point
    takes its ring from its own tile. The ring is the true one unless one of its dual
    triangles reaches further beyond the tile than the overlap (near the hull: long flat
    triangles): then the cell built from it is a superset of the true one, which the
    area certificate finds and the repair clips. A point hidden in any tile is hidden
    (the lower hull of more points is lower): it gets count 0.
    """
    keep = np.flatnonzero(active)
    pieces = max(-(-keep.size // tile_points), settings().threads if keep.size >= TILED_FROM else 1)
    if pieces < 2 or p.shape[1] != 2:
        return rings(p, psi, active, stop_if_hidden)
    n = len(p)
    tiles = overlapping_tiles(p, active, pieces)

    def triangulate(members):
        found = rings(p[members], psi[members], np.ones(members.size, bool), stop_if_hidden)
        if found is None:
            return None
        lab, count, closed = found
        return np.where(lab >= 0, members[np.maximum(lab, 0)], -1), count, closed
    found = map_on_threads(triangulate, [members for members, _ in tiles])
    if any(f is None for f in found):
        return None
    width = max(f[0].shape[1] for f in found)
    labels, count = -np.ones((n, width), np.int64), np.zeros(n, np.int64)
    closed, hidden = np.zeros(n, bool), np.zeros(n, bool)
    for (members, own), (lab, cnt, cls) in zip(tiles, found):
        rows = members[own]
        labels[rows, :lab.shape[1]], count[rows], closed[rows] = lab[own], cnt[own], cls[own]
        hidden[members[cnt == 0]] = True
    labels[hidden], count[hidden], closed[hidden] = -1, 0, False
    return labels, count, closed


def overlapping_tiles(p, active, tiles):
    """About ``tiles`` tiles of the ``active`` points: ``(members, own)`` per tile, the
    points it triangulates and which of them are its own (each active point in one
    tile, each tile with at least one)."""
    keep = np.flatnonzero(active)
    x, y = p[:, 0], p[:, 1]
    low, high = p[keep].min(axis=0), p[keep].max(axis=0)
    side = np.maximum(high - low, np.finfo(p.dtype).tiny)
    slabs = int(np.clip(np.rint(np.sqrt(tiles * side[0] / side[1])), 1, tiles))
    per_slab = -(-tiles // slabs)
    depth = TILE_OVERLAP * np.sqrt(side[0] * side[1] / keep.size)
    cuts = np.quantile(x[keep], np.arange(1, slabs) / slabs)
    slab = np.searchsorted(cuts, x[keep], side="right")
    owner = -np.ones(len(p), np.int64)
    out = []
    for s in range(slabs):
        mine = keep[slab == s]
        lo_x, hi_x = (cuts[s - 1] if s else -np.inf), (cuts[s] if s < slabs - 1 else np.inf)
        if mine.size == 0:
            continue
        near = np.flatnonzero(active & (x >= lo_x - depth) & (x <= hi_x + depth))
        y_cuts = np.quantile(y[mine], np.arange(1, per_slab) / per_slab)
        owner[mine] = s * per_slab + np.searchsorted(y_cuts, y[mine], side="right")
        bounds = np.concatenate([[-np.inf], y_cuts, [np.inf]])
        for t in range(per_slab):
            members = near[((y[near] >= bounds[t] - depth) & (y[near] <= bounds[t + 1] + depth))
                           | (owner[near] == s * per_slab + t)]
            own = owner[members] == s * per_slab + t
            if own.any():                  # (ties in y can leave a tile without points)
                out.append((members, own))
    return out


def rings(p, psi, active, stop_if_hidden=False):
    """Each ``active`` point's neighbours in the regular triangulation of the points ``p``
    with weights ``psi``, counter-clockwise around it: ``(labels (n, W), count (n,),
    closed (n,))``, -1 padding, the layout of ``seed_neighbours.regular_rings``; computed in Morton
    order. None if Qhull fails. ``stop_if_hidden``: if an active point is hidden, only
    ``count`` is right."""
    from scipy.spatial import QhullError

    n = len(p)
    try:
        keep, tri, left_out = lower_triangles(p, psi, np.flatnonzero(active), strict=True, coplanar=True)
    except (QhullError, ValueError):
        return None
    count = np.zeros(n, np.int64)
    count[keep] = np.bincount(tri.reshape(-1), minlength=keep.size)
    if stop_if_hidden and np.any(active & (count == 0)):
        return -np.ones((n, 1), np.int64), count, np.zeros((n,), bool)
    q = p[keep]
    a, b, c = q[tri[:, 0]], q[tri[:, 1]], q[tri[:, 2]]
    cross = (b[:, 0] - a[:, 0]) * (c[:, 1] - a[:, 1]) - (b[:, 1] - a[:, 1]) * (c[:, 0] - a[:, 0])
    tri = np.where((cross < 0)[:, None], tri[:, [0, 2, 1]], tri)         # counter-clockwise
    seed = tri.reshape(-1)                  # each corner of each triangle: its point,
    prv = tri[:, [1, 2, 0]].reshape(-1)     # the neighbour of its incoming edge,
    nxt = tri[:, [2, 0, 1]].reshape(-1)     # that of its outgoing edge
    d = 0.5 * (q[prv] + q[nxt]) - q[seed]   # inside the triangle's angle at the point
    r = d[:, 1] / np.maximum(np.abs(d[:, 0]) + np.abs(d[:, 1]), np.finfo(d.dtype).tiny)
    turn = np.where(d[:, 0] >= 0, r + 1.0, 3.0 - r)      # in [0, 4), increasing counter-clockwise
    order = np.argsort(seed * 4.0 + turn)
    seed, prv, nxt = keep[seed[order]], keep[prv[order]], keep[nxt[order]]
    sizes = count[keep]                                   # the rings, in Morton order
    starts = np.repeat(np.cumsum(sizes) - sizes, sizes)   # each corner's ring's first corner
    pos = np.arange(seed.size) - starts
    # closed: the neighbour after each outgoing edge is the next corner's incoming one
    after = np.where(pos + 1 < count[seed], np.arange(1, seed.size + 1), starts)
    broken = np.bincount(seed, weights=prv[after] != nxt, minlength=n)
    closed = (broken == 0) & (count >= 3)
    width = max(int(count.max(initial=0)), 1)
    labels = -np.ones((n, width), np.int64)
    labels[seed, pos] = nxt
    # an open ring (on the hull) misses the neighbour of its first incoming edge: add every
    # incoming neighbour that is no outgoing one
    rows = np.flatnonzero(~closed & (count > 0))
    if rows.size:
        incoming = -np.ones((n, width), np.int64)
        corner = ~closed[seed]
        incoming[seed[corner], pos[corner]] = prv[corner]
        k = np.arange(width)[None, :]
        missing = (np.all(incoming[rows, :, None] != labels[rows, None, :], axis=2)
                   & (k < count[rows, None]))
        extra = np.cumsum(missing, axis=1) - 1 + count[rows, None]          # their slots
        labels = np.pad(labels, ((0, 0), (0, max(int(extra.max(initial=0)) + 1 - width, 0))),
                        constant_values=-1)
        labels[np.broadcast_to(rows[:, None], missing.shape)[missing], extra[missing]] = incoming[rows][missing]
        count[rows] += missing.sum(axis=1)
    return with_dropped_points(p, active, labels, count, closed, may_be_hidden(p, psi, active, left_out))


def may_be_hidden(p, psi, active, left_out):
    """Which points in no triangle may be hidden: none at equal weights; else those Qhull did
    not leave out within its roundoff of a facet (``left_out``, its coplanar points): they lie
    clearly above the lower hull."""
    hidden = np.zeros(len(p), bool)
    if psi is not None and active.any() and np.ptp(psi[active]) > 0:
        hidden[active] = True
        hidden[left_out] = False
    return hidden


def with_dropped_points(p, active, labels, count, closed, hidden):
    """The rings with the active points in no triangle that are not ``hidden`` (left out by
    Qhull within its roundoff) listing their :data:`DROPPED_NEIGHBOURS` nearest active
    points, and those points listing them too: open rings, clipped from the box by every
    neighbour listed.

    Qhull leaves a point out where it sees it within its roundoff of the hull: of 5 Diracs
    in a cluster 1e-7 wide in the unit square, one (their Voronoi start then had an empty
    cell and the solve stalled at once). Its neighbours' cells were built without it, so
    each of them is clipped by it too (a new point's neighbours are among the old ones' and
    itself)."""
    dropped = np.flatnonzero(active & (count == 0) & ~hidden)
    if dropped.size == 0 or np.count_nonzero(active) < 2:
        return labels, count, closed
    labels, redo = with_candidates(labels, np.arange(len(p)), *nearest_pairs(p, dropped, active))
    return labels, np.where(redo, np.sum(labels >= 0, axis=1), count), closed & ~redo


def nearest_pairs(p, points, active):
    """``(rows, cols)``: each of ``points`` with its :data:`DROPPED_NEIGHBOURS` nearest
    ``active`` points (at least two), both ways."""
    from scipy.spatial import cKDTree

    keep = np.flatnonzero(active)
    k = min(DROPPED_NEIGHBOURS, keep.size - 1) + 1
    near = keep[np.asarray(cKDTree(p[keep]).query(p[points], k=k)[1]).reshape(points.size, k)[:, 1:]].reshape(-1)
    own = np.repeat(points, k - 1)
    return np.concatenate([own, near]), np.concatenate([near, own])


def with_candidates(table, rows, seeds, extra):
    """``table`` (r, W) of the seeds ``rows`` (ascending) with the candidates ``extra`` of
    the seeds ``seeds`` added to their rows (ascending, without repeats, -1 padding), and
    which rows changed."""
    redo = np.isin(rows, seeds)
    if not redo.any():
        return table, redo
    sub = np.flatnonzero(redo)
    pairs = np.concatenate([np.stack([np.repeat(rows[sub], table.shape[1]), table[sub].reshape(-1)], 1),
                            np.stack([seeds, extra], 1)])
    pairs = np.unique(pairs[pairs[:, 1] >= 0], axis=0)
    where = sub[np.searchsorted(rows[sub], pairs[:, 0])]
    slot = np.arange(len(pairs)) - np.searchsorted(where, where)        # (pairs by row, ascending)
    out = np.pad(table, ((0, 0), (0, max(int(slot.max()) + 1 - table.shape[1], 0))), constant_values=-1)
    out[sub] = -1
    out[where, slot] = pairs[:, 1]
    return out, redo


def lower_triangles(p, psi, keep, strict=False, coplanar=False):
    """Simplices (triangles in 2D, tetrahedra in 3D) of the regular triangulation of the points ``keep``: the lower
    facets of the hull of ``(y_i, |y_i - c|^2 - psi_i)`` (Delaunay if ``psi`` is None).
    Returns ``(order, tri)``: ``keep`` in Morton order (Qhull is faster on spatially
    sorted points) and the triangles (T, 3) as positions in it (nearby points, nearby
    in memory). ``strict``: without vertical facets. ``coplanar``: also the points Qhull
    left out within its roundoff of a facet (Qhull's ``Qc``; not the points clearly above
    the lower hull, which are hidden), as indices into ``p``. Raises QhullError or
    ValueError on degenerate inputs."""
    from scipy.spatial import ConvexHull, Delaunay

    keep = keep[morton_order(p[keep])]
    if psi is None:
        tri = Delaunay(p[keep])
        return (keep, tri.simplices) + ((keep[tri.coplanar[:, 0]],) if coplanar else ())
    q = p[keep] - np.median(p[keep], axis=0)    # (not the mean, which a far point drags away)
    hull = ConvexHull(np.column_stack([q, np.sum(q * q, axis=1) - psi[keep]]),
                      qhull_options="Qt Qc" if coplanar else "Qt")
    lift = hull.equations[:, p.shape[1]]
    lower = lift < 0 if strict else lift <= 0
    return (keep, hull.simplices[lower]) + ((keep[hull.coplanar[:, 0]],) if coplanar else ())


def morton_order(p):
    """Permutation sorting the points ``p`` (m, 2) or (m, 3) along a Z-order curve (16 bits
    per coordinate in 2D, 21 in 3D: Qhull's lifted hull of 1e5 points in the cube took 3.2 s
    in this order, 4.8 s in the order of the first two coordinates alone)."""
    span = np.ptp(p, axis=0)
    if p.shape[1] == 3:
        grid = ((p - p.min(axis=0)) / np.where(span > 0, span, 1.0) * (2 ** 21 - 1)).astype(np.uint64)

        def spread3(v):                             # the 21 bits of v on every third bit
            for shift, mask in ((32, 0x1F00000000FFFF), (16, 0x1F0000FF0000FF), (8, 0x100F00F00F00F00F),
                                (4, 0x10C30C30C30C30C3), (2, 0x1249249249249249)):
                v = (v | (v << np.uint64(shift))) & np.uint64(mask)
            return v
        key = spread3(grid[:, 0]) | (spread3(grid[:, 1]) << np.uint64(1)) | (spread3(grid[:, 2]) << np.uint64(2))
        return np.argsort(key, kind="stable")
    grid = ((p - p.min(axis=0)) / np.where(span > 0, span, 1.0) * 65535).astype(np.uint64)

    def spread(v):                                  # the 16 bits of v on the even bits
        for shift, mask in ((8, 0x00FF00FF), (4, 0x0F0F0F0F), (2, 0x33333333), (1, 0x55555555)):
            v = (v | (v << np.uint64(shift))) & np.uint64(mask)
        return v
    return np.argsort(spread(grid[:, 0]) | (spread(grid[:, 1]) << np.uint64(1)), kind="stable")
