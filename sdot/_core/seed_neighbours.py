"""Neighbours: k nearest, Delaunay and regular triangulations (scipy on the host,
:mod:`sdot._host.triangulation`; a brute force in pure array API otherwise)."""
from __future__ import annotations

import itertools

import array_api_compat as aac

from .._host import slabs_3d
from .._host import triangulation as host_triangulation
from ._compat.arrays import dot, segment_sum, set_rows, smallest
from ._compat.host import from_host, host_callback, host_view, is_traced, on_host, static_shapes, to_int


def knn(xp, points, k: int):
    """Indices ``(n, k)`` of the k nearest ``points`` of each point (itself first).

    scipy's cKDTree on the host; otherwise in pure array API, eagerly by a grid
    (:func:`_knn_by_grid`), else (traced, or clustered points) a chunked brute force
    (O(n^2) work).
    """
    out = host_callback(xp, lambda p: host_triangulation.k_nearest(p, k), (points.shape[0], k),
                        host_triangulation.INDEX, points)
    if out is None and not static_shapes(points) and not aac.is_jax_array(points):
        out = _knn_by_grid(xp, points, k)
    return _knn_brute_force(xp, points, k, points) if out is None else out


#: Points per cell of the grid of :func:`_knn_by_grid`, and the cells its search block adds
#: on each side of a point's own: no point outside the block is nearer than ``BLOCK`` cell
#: widths. Uniform points: the 21st nearest in 2D lies within about 1.5 widths, the 32nd in 3D
#: within 1.4; at 1e5 points 469 rows (2D) and 93 (3D) were farther and took the brute force
#: (2 points a cell: 13,731 rows in 2D, 5.7 s instead of 0.7).
GRID_POINTS = 3
BLOCK = 2


def _knn_by_grid(xp, points, k: int):
    """Eagerly, the k nearest of each point among the points of the ``(2 BLOCK + 1)^d`` cells
    of a uniform grid (:data:`GRID_POINTS` points a cell) around its own: exact where the
    k-th is within ``BLOCK`` cell widths, the other rows by the brute force. None where the
    fullest cell gives a row more than a quarter of the points as candidates (clustered
    points: the brute force then costs about as much)."""
    n, d = points.shape
    dev = aac.device(points)
    side = max(int((n / GRID_POINTS) ** (1.0 / d)), 1)
    lo, hi = xp.min(points, axis=0), xp.max(points, axis=0)
    width = xp.where(hi > lo, (hi - lo) / side, xp.ones_like(hi))
    cell = xp.astype(xp.floor((points - lo) / width), xp.int64)
    cell = xp.minimum(xp.maximum(cell, 0), side - 1)
    counts = segment_sum(xp, xp.ones((n,), dtype=xp.int64, device=dev), _flat(xp, cell, side), side ** d)
    most = to_int(xp.max(counts))
    span = 2 * BLOCK + 1
    if span ** d * most * 4 > n or k > n:
        return None
    order = xp.argsort(_flat(xp, cell, side), stable=True)
    starts = xp.cumulative_sum(counts) - counts
    steps = xp.asarray(list(itertools.product(range(-BLOCK, BLOCK + 1), repeat=d)), dtype=xp.int64, device=dev)
    slots = xp.arange(most, dtype=xp.int64, device=dev)
    reach = BLOCK * xp.min(width)
    out = xp.empty((n, k), dtype=xp.int64, device=dev)
    exact = xp.empty((n,), dtype=xp.bool, device=dev)
    chunk = max(1, int(4e6 // (span ** d * most * d)))
    for start in range(0, n, chunk):
        rows = slice(start, min(start + chunk, n))
        around = cell[rows, None, :] + steps[None, :, :]                            # (m, B, d)
        inside = xp.all((around >= 0) & (around < side), axis=2)
        key = _flat(xp, xp.minimum(xp.maximum(around, 0), side - 1), side)          # (m, B)
        held = xp.where(inside, xp.reshape(xp.take(counts, xp.reshape(key, (-1,))), key.shape), 0)
        first = xp.reshape(xp.take(starts, xp.reshape(key, (-1,))), key.shape)
        valid = slots[None, None, :] < held[:, :, None]                           # (m, B, most)
        at = xp.where(valid, first[:, :, None] + slots[None, None, :], 0)
        m = at.shape[0]
        candidates = xp.reshape(xp.take(order, xp.reshape(at, (-1,))), (m, -1))
        gap = xp.reshape(xp.take(points, xp.reshape(candidates, (-1,)), axis=0), (m, -1, d)) - points[rows, None, :]
        d2 = xp.where(xp.reshape(valid, (m, -1)), dot(gap, gap), xp.inf)
        nearest = xp.astype(smallest(xp, d2, k), xp.int64)
        out[rows, :] = xp.take_along_axis(candidates, nearest, axis=1)
        exact[rows] = xp.take_along_axis(d2, nearest[:, k - 1:], axis=1)[:, 0] <= reach * reach
    if not bool(xp.all(exact)):
        redo = xp.nonzero(~exact)[0]
        out = set_rows(xp, out, redo, _knn_brute_force(xp, points, k, xp.take(points, redo, axis=0)))
    return out


def _flat(xp, cell, side: int):
    """The grid cell's number of integer coordinates ``cell`` (..., d) on ``side`` cells an axis."""
    key = cell[..., 0]
    for axis in range(1, cell.shape[-1]):
        key = key * side + cell[..., axis]
    return key


def delaunay_neighbours(xp, points, width=None, weights=None, active=None):
    """Neighbours of each point in the Delaunay triangulation, ``(n, W)`` (``W`` the
    largest degree), -1 padding; points without a triangle (duplicates, collinear
    inputs) get their nearest points instead.

    scipy's Qhull on the host. Under ``jax.jit`` (through the host callback, which runs
    on a thread of its own) only with a static ``width``: the first ``width`` neighbours
    of each point; there, with ``weights`` (and ``active``), the neighbours in the regular
    triangulation of the active points instead, where it gives any (the seeds that cut
    each power cell: a diagram at weights far from 0, such as one Dirac at 1e6 with the
    weight that gives it a cell in the box, has other neighbours than Voronoi's). None
    without a host: the caller falls back to :func:`knn`.
    """
    if is_traced(points):
        if width is None:
            return None
        extra = () if weights is None else (weights, active)
        return host_callback(xp, lambda p, *psi_active: host_triangulation.fixed_width_table(p, width, *psi_active),
                             (points.shape[0], width), host_triangulation.INDEX, points, *extra)
    host = host_view(points)
    if host is None:
        return None
    return from_host(xp, host_triangulation.delaunay_table(host), points)


def regular_neighbours(xp, points, weights, active):
    """Neighbours of each active point in the regular (weighted Delaunay)
    triangulation of ``points`` with ``weights`` (None: Delaunay), ``(n, W)``, -1 padding.

    The triangulation is the lower convex hull of the lifted points
    ``(y_i, |y_i - c|^2 - psi_i)``; point i's power cell is the intersection of
    the half-planes of its neighbours there, so they are exactly the seeds that
    can cut it. Rows of hidden (empty-celled) and inactive points are all -1.
    Eagerly on the host only (scipy's Qhull); None otherwise or if Qhull fails.
    """
    if weights is None:
        table = on_host(lambda p, a: host_triangulation.regular_table(p, None, a), points, active)
    else:
        table = on_host(host_triangulation.regular_table, points, weights, active)
    return None if table is None else from_host(xp, table, points)


def regular_cell_combinatorics(xp, points, weights, active, f_cap: int, v_cap: int, slabs: int | None = None, *,
                               slabs_from: int, overlap: float):
    """The 3D power cells' combinatorics read off the regular triangulation of the active
    ``points`` with ``weights`` (None: equal weights, Delaunay), in ``f_cap`` facet and
    ``v_cap`` vertex slots: a dict of arrays, see
    :func:`sdot._host.cells_3d.cell_combinatorics`, read in ``slabs`` slabs on the threads
    (default: one per thread from ``slabs_from`` active points, ``overlap`` mean spacings deep
    beyond their sides, see :mod:`sdot._host.slabs_3d`; then ``slabs`` in the dict
    is true and the cells are to be certified). Eagerly on the host only (scipy's Qhull);
    None otherwise or if Qhull fails."""
    found = on_host(lambda p, a, *w: slabs_3d.slab_cell_combinatorics(p, w[0] if w else None, a, f_cap, v_cap, slabs,
                                                                      slabs_from=slabs_from, overlap=overlap),
                    points, active, *(() if weights is None else (weights,)))
    return None if found is None else {k: from_host(xp, v, points) for k, v in found.items()}


def regular_rings(xp, points, weights, active, stop_if_hidden=False, *, tile_points: int):
    """Each active point's neighbours in the regular triangulation, counter-clockwise
    around it: ``(labels (n, W), count (n,), closed (n,))``, -1 padding.

    The dual triangles of point i, in angular order, give the vertices of its
    power cell; ``labels[i, k]`` is the neighbour across the edge from vertex k
    to vertex k + 1 (the :mod:`.polygons` convention). ``closed``: the ring goes
    all the way round; an open ring (a point on the hull) lists every
    neighbour, in no useful order. Hidden and inactive points have count 0.
    ``stop_if_hidden``: if an active point is hidden, only ``count`` is right.
    Eagerly on the host only (scipy's Qhull, in tiles of about ``tile_points`` points,
    see :func:`sdot._host.triangulation.tiled_rings`); None otherwise or if Qhull fails.
    """
    found = on_host(lambda *a: host_triangulation.tiled_rings(*a, stop_if_hidden, tile_points=tile_points),
                    points, weights, active)
    return None if found is None else tuple(from_host(xp, a, points) for a in found)


def nearest(xp, points, queries):
    """Index ``(m,)`` of the nearest of ``points`` to each of ``queries``."""
    out = host_callback(xp, host_triangulation.nearest, (queries.shape[0],), host_triangulation.INDEX, points, queries)
    return _knn_brute_force(xp, points, 1, queries)[:, 0] if out is None else out


def _knn_brute_force(xp, points, k, queries):
    """The ``k`` nearest ``points`` of each of the ``queries``, ``(m, k)``: the distances in
    blocks of about 4e6 entries. Where arrays are mutable the blocks' results are written into
    one output (a list of them, each allocated after a block's distances, kept the heap from
    being reused: torch's resident memory grew 7 GB over 3e4 points)."""
    n, dim = points.shape
    m = queries.shape[0]
    chunk = max(1, int(4e6 // max(n * dim, 1)))
    mutable = not aac.is_jax_array(points)
    out = xp.empty((m, k), dtype=xp.int64, device=aac.device(points)) if mutable else None
    rows = []
    for start in range(0, m, chunk):
        block = queries[start:min(start + chunk, m), :]
        diff = block[:, None, :] - points[None, :, :]
        nearest = xp.astype(smallest(xp, dot(diff, diff), k), xp.int64)
        if mutable:
            out[start:start + block.shape[0], :] = nearest
        else:
            rows.append(nearest)
    return out if mutable else xp.concat(rows, axis=0)
