"""Power cells in 3D, each clipped on its own from the box (numba, rows on the host's threads).

A diagram is found in the cheapest of three ways that its certificate accepts:

1. **Moved** (given the previous diagram of the same seeds): each cell keeps its
   combinatorics, its vertices moved to the new weights (each the meeting point of its three
   facets' planes, by Cramer's rule), while no edge shrinks through zero length
   (:func:`moved_rows`, as :mod:`..spatial.kinetic`).
2. **Ring**: the cells that did not stay valid and their neighbours (or, with many invalid,
   every cell) clipped again from the box by their neighbours and their neighbours'
   neighbours (a flip gives a cell a neighbour of a neighbour); then the few cells that a
   neighbour contradicts (a seed farther away should have cut them: :mod:`.agreement`) by
   the tree.
3. **Tree**: every cell clipped by its previous neighbours (if any; else, for a Voronoi
   diagram, by its nearest seeds), then by the seeds of the k-d tree (:mod:`.tree`) that may
   cut it, nearest first, skipping every node that cannot: at a vertex ``v`` no seed under node
   ``k`` has a power below the node's bound (:mod:`.tree`: the distance to its box, corrected
   by the plane fitted to its weights), so a node where that exceeds the cell's own power
   ``|v - y_i|^2 - psi_i`` at every vertex (first tested on the sphere around the seed through
   its farthest vertex, then on the vertices' box) holds no seed that cuts it. Exact up to
   rounding, whatever the weights (the radius of security of Lévy and Ray's meshless Voronoi
   cells with the weights of each subtree; the nearest neighbours of lifted points fail when
   the weights vary on the domain's scale).

Certificate (of 1 and 2): a cell cut by a subset of its constraints contains the true cell,
and the true cells tile the box, so the cells are exact when their volumes add up to the
box's (up to rounding), provided none of them is empty where the true one may not be.

Output: the layout of :class:`..spatial.polyhedra.Cells`, facets and vertices compacted.
"""
from __future__ import annotations

import numpy as np

from . import polyhedron as ph
from ._numba import njit

#: Scratch capacity of a cell while it is clipped: facet slots (vertex slots: twice as many).
SCRATCH_FACETS = 256
#: Seeds per leaf of the tree (at most one more).
LEAF = 8
#: The label of a facet slot not in use (they follow the cell's facets).
UNUSED = -7
#: Per-cell results: fine, more slots needed than given, a cycle broken by rounding.
FINE, OVERFLOWED, BROKEN = 0, 1, 2



@njit
def _box_distance2(p0, p1, p2, lo, hi, k):
    g = max(lo[k, 0] - p0, p0 - hi[k, 0], 0.0)
    d = g * g
    g = max(lo[k, 1] - p1, p1 - hi[k, 1], 0.0)
    d += g * g
    g = max(lo[k, 2] - p2, p2 - hi[k, 2], 0.0)
    return d + g * g


@njit
def _cannot_cut(vx, size, y, w, shape, lo, hi, g, big, k):
    """Whether no seed under node ``k`` cuts the cell (vertices ``vx`` about ``y``, weight ``w``,
    :func:`.polyhedron.measure` ``shape``), by the bound of :mod:`.tree` (``g``, ``big``): on the
    sphere through the farthest vertex, then on the vertices' box, then at every vertex."""
    r2 = shape[0]
    h0, h1, h2 = 0.5 * g[k, 0], 0.5 * g[k, 1], 0.5 * g[k, 2]
    gy = g[k, 0] * y[0] + g[k, 1] * y[1] + g[k, 2] * y[2]
    # (with a rounding margin: beside a Dirac 1e6 away the terms reach 1e12)
    own = r2 - w + 64.0 * 2.0 ** -52 * (abs(gy) + abs(big[k]) + abs(w) + r2 + y[0] * y[0] + y[1] * y[1] + y[2] * y[2])
    d2 = _box_distance2(y[0] + h0, y[1] + h1, y[2] + h2, lo, hi, k)
    if d2 > r2:
        radius = np.sqrt(r2)
        gap = np.sqrt(d2) - radius
        if gap * gap - gy - 2.0 * np.sqrt(h0 * h0 + h1 * h1 + h2 * h2) * radius - big[k] >= own:
            return True
    g0 = max(lo[k, 0] - (y[0] + h0 + shape[2]), (y[0] + h0 + shape[1]) - hi[k, 0], 0.0)
    g1 = max(lo[k, 1] - (y[1] + h1 + shape[4]), (y[1] + h1 + shape[3]) - hi[k, 1], 0.0)
    g2 = max(lo[k, 2] - (y[2] + h2 + shape[6]), (y[2] + h2 + shape[5]) - hi[k, 2], 0.0)
    support = 2.0 * (max(h0 * shape[1], h0 * shape[2]) + max(h1 * shape[3], h1 * shape[4])
                     + max(h2 * shape[5], h2 * shape[6]))
    if g0 * g0 + g1 * g1 + g2 * g2 - gy - support - big[k] >= own:
        return True
    for v in range(size):
        x0, x1, x2 = vx[v, 0], vx[v, 1], vx[v, 2]
        bound = (_box_distance2(y[0] + x0 + h0, y[1] + x1 + h1, y[2] + x2 + h2, lo, hi, k)
                 - gy - 2.0 * (h0 * x0 + h1 * x1 + h2 * x2) - big[k])
        if bound < x0 * x0 + x1 * x1 + x2 * x2 + own - r2:
            return False
    return True


@njit
def _clip_by_seed(vx, cn, ad, lab, size, count, points, weights, t, j, y, w, shape, s, tab2, tab3, gone, work_v,
                  work_k, work_p):
    """The cell (about ``y``, weight ``w``) clipped by seed ``j`` at ``points[t]`` of weight
    ``weights[t]``: ``u . d <= (|d|^2 + w - psi_j) / 2``, ``d = y_j - y``, unless the sphere
    through the farthest vertex or the vertices' box lie inside; ``(size, count, status)``."""
    d0 = points[t, 0] - y[0]
    d1 = points[t, 1] - y[1]
    d2 = points[t, 2] - y[2]
    dd = d0 * d0 + d1 * d1 + d2 * d2
    off = 0.5 * (dd + w - weights[t])
    if off > 0.0 and off * off > shape[0] * dd:
        return size, count, ph.UNCHANGED
    if max(shape[1] * d0, shape[2] * d0) + max(shape[3] * d1, shape[4] * d1) + max(shape[5] * d2, shape[6] * d2) <= off:
        return size, count, ph.UNCHANGED
    return ph.clip(vx, cn, ad, lab, size, count, d0, d1, d2, off, j, _margin(off, dd, shape[0]), s, tab2, tab3, gone,
                   work_v, work_k, work_p, shape)


@njit
def _margin(off, dd, r2):
    """The rounding tolerance of a clip by ``u . d <= off`` of a cell within ``sqrt(r2)`` of its
    seed: a few units in the last place of the terms of ``u . d - off`` (64 of them kept
    vertices that a plane cut 1e-8 deep in the cell of a Dirac 1e6 away)."""
    return 4.0 * 2.0 ** -52 * (abs(off) + np.sqrt(dd * r2))


@njit
def cells_rows(first, last, rows, seeds, psi, active, box_lo, box_hi, hints, ring, perm, rank, points, weights,
               start, end, lo, hi, g, big, cube_corners, cube_planes, cube_adjacent,
               out_vx, out_cn, out_ad, out_size, out_lab, out_count, out_status, out_volume,
               vx, cn, ad, lab, s, tab2, tab3, gone, work_v, work_k, work_p, stamp, stack, y, shape):
    """The cells of the seeds ``rows[first:last]`` written into those rows of ``out_*``: the
    box clipped by the seed's ``hints``, then by the hints of its hints (``ring``: not
    certified), else (or without hints) by the seeds of the tree (``perm`` ... ``big``,
    :mod:`.tree`: ``rank`` the place of each seed in ``perm`` (``len(perm)`` if none), ``points``
    and ``weights`` the seeds' in that order). ``vx`` ... ``shape``: :func:`scratch` (``stamp``:
    the last cell clipped by each seed, by rank)."""
    n_nodes = start.shape[0]
    first_leaf = (n_nodes - 1) // 2
    v_out = out_vx.shape[1]
    f_out = out_lab.shape[1]
    for r in range(first, last):
        i = rows[r]
        out_status[i] = FINE
        out_volume[i] = 0.0
        out_size[i] = 0
        out_count[i] = 0
        for f in range(f_out):
            out_lab[i, f] = UNUSED
        if not active[i]:
            continue
        for a in range(3):
            y[a] = seeds[i, a]
        w = psi[i]
        size, count = ph.start_box(vx, cn, ad, lab, box_lo, box_hi, y, cube_corners, cube_planes, cube_adjacent)
        ph.measure(vx, size, shape)
        status = ph.UNCHANGED
        stamp[rank[i]] = i
        hinted = False
        for h in range(hints.shape[1]):
            j = hints[i, h]
            if j == UNUSED:
                break
            if j < 0 or not active[j] or stamp[rank[j]] == i:
                continue
            stamp[rank[j]] = i
            hinted = True
            t = rank[j]
            d0, d1, d2 = points[t, 0] - y[0], points[t, 1] - y[1], points[t, 2] - y[2]
            off = 0.5 * (d0 * d0 + d1 * d1 + d2 * d2 + w - weights[t])
            size, count, status = ph.clip(vx, cn, ad, lab, size, count, d0, d1, d2, off, j,
                                          _margin(off, d0 * d0 + d1 * d1 + d2 * d2, shape[0]), s, tab2, tab3,
                                          gone, work_v, work_k, work_p, shape[:0])
            if status >= ph.EMPTIED:
                break
        ph.measure(vx, size, shape)
        if ring and hinted:
            for h in range(hints.shape[1]):
                a = hints[i, h]
                if a == UNUSED or status >= ph.EMPTIED:
                    break
                if a < 0:
                    continue
                for h2 in range(hints.shape[1]):
                    j = hints[a, h2]
                    if j == UNUSED:
                        break
                    if j < 0 or not active[j] or stamp[rank[j]] == i:
                        continue
                    stamp[rank[j]] = i
                    size, count, status = _clip_by_seed(vx, cn, ad, lab, size, count, points, weights, rank[j], j, y,
                                                        w, shape, s, tab2, tab3, gone, work_v, work_k, work_p)
                    if status >= ph.EMPTIED:
                        break
        depth = 0
        if status < ph.EMPTIED and n_nodes > 0 and not (ring and hinted):
            stack[0] = 0
            depth = 1
        while depth > 0:
            depth -= 1
            k = stack[depth]
            if end[k] <= start[k] or _cannot_cut(vx, size, y, w, shape, lo, hi, g, big, k):
                continue
            if k >= first_leaf:
                for t in range(start[k], end[k]):
                    if stamp[t] == i:
                        continue
                    stamp[t] = i
                    size, count, status = _clip_by_seed(vx, cn, ad, lab, size, count, points, weights, t, perm[t], y,
                                                        w, shape, s, tab2, tab3, gone, work_v, work_k, work_p)
                    if status >= ph.EMPTIED:
                        break
                if status >= ph.EMPTIED:
                    break
            else:
                near, far = 2 * k + 1, 2 * k + 2
                if (_box_distance2(y[0], y[1], y[2], lo, hi, near)
                        > _box_distance2(y[0], y[1], y[2], lo, hi, far)):
                    near, far = far, near
                if depth + 2 > stack.shape[0]:
                    status = ph.OVERFLOW
                    break
                stack[depth] = far
                stack[depth + 1] = near
                depth += 2
        if status == ph.EMPTIED:
            continue
        if status == ph.BROKEN:
            out_status[i] = BROKEN
            continue
        count = ph.compact_facets(cn, lab, size, count, work_v)
        size = ph.compact_vertices(vx, cn, ad, size, work_k)
        if status == ph.OVERFLOW or size > v_out or count > f_out:
            out_status[i] = OVERFLOWED
            continue
        for v in range(size):
            for a in range(3):
                out_vx[i, v, a] = vx[v, a]
                out_cn[i, v, a] = cn[v, a]
                out_ad[i, v, a] = ad[v, a]
        for f in range(count):
            out_lab[i, f] = lab[f]
        out_size[i] = size
        out_count[i] = count
        out_volume[i] = ph.volume(vx, cn, ad, size, work_v)


@njit
def _plane(seeds, psi, i, label, box_lo, box_hi, out):
    """The plane ``u . n = b`` (about seed ``i``) of facet ``label``: ``out = (n0, n1, n2, b)``."""
    if label >= 0:
        d0 = seeds[label, 0] - seeds[i, 0]
        d1 = seeds[label, 1] - seeds[i, 1]
        d2 = seeds[label, 2] - seeds[i, 2]
        out[0], out[1], out[2] = d0, d1, d2
        out[3] = 0.5 * (d0 * d0 + d1 * d1 + d2 * d2 + psi[i] - psi[label])
    else:
        side = -1 - label
        axis = side // 2
        sign = 1.0 if side % 2 == 1 else -1.0
        out[0] = out[1] = out[2] = 0.0
        out[axis] = sign
        out[3] = sign * ((box_hi[axis] if side % 2 == 1 else box_lo[axis]) - seeds[i, axis])


@njit
def moved_rows(first, last, seeds, psi, active, box_lo, box_hi, vertices, corners, adjacent, size, labels,
               out_vx, out_valid, out_volume, planes, ref, step=1):
    """The cells ``first, first + step, ... < last`` of a previous diagram (``vertices`` ... ``labels``) with
    their vertices moved to the weights ``psi`` into ``out_vx``; ``out_valid``: whether the cell
    keeps its edges (every vertex well defined, every edge's far end strictly inside the plane
    of the third facet at its near end), ``out_volume`` its volume. An active cell that was
    empty is not valid (it may reappear), nor one far from its seed (beyond twice the box's
    diagonal: nearly parallel planes). ``planes`` (V, 3, 4), ``ref``: scratch."""
    eps = 2.0 ** -52
    far2 = 4.0 * ((box_hi[0] - box_lo[0]) ** 2 + (box_hi[1] - box_lo[1]) ** 2 + (box_hi[2] - box_lo[2]) ** 2)
    for i in range(first, last, step):
        m = size[i]
        out_volume[i] = 0.0
        if m == 0:
            out_valid[i] = not active[i]
            continue
        if vertices[i, 0, 0] ** 2 + vertices[i, 0, 1] ** 2 + vertices[i, 0, 2] ** 2 > far2:
            out_valid[i] = False                # far from its seed: nearly parallel planes, clipped again
            continue
        ok = True
        for v in range(m):
            for a in range(3):
                _plane(seeds, psi, i, labels[i, corners[i, v, a]], box_lo, box_hi, planes[v, a])
            p = planes[v, 0]
            q = planes[v, 1]
            t = planes[v, 2]
            qr0 = q[1] * t[2] - q[2] * t[1]
            qr1 = q[2] * t[0] - q[0] * t[2]
            qr2 = q[0] * t[1] - q[1] * t[0]
            rp0 = t[1] * p[2] - t[2] * p[1]
            rp1 = t[2] * p[0] - t[0] * p[2]
            rp2 = t[0] * p[1] - t[1] * p[0]
            pq0 = p[1] * q[2] - p[2] * q[1]
            pq1 = p[2] * q[0] - p[0] * q[2]
            pq2 = p[0] * q[1] - p[1] * q[0]
            det = p[0] * qr0 + p[1] * qr1 + p[2] * qr2
            scale = np.sqrt((p[0] * p[0] + p[1] * p[1] + p[2] * p[2]) * (q[0] * q[0] + q[1] * q[1] + q[2] * q[2])
                            * (t[0] * t[0] + t[1] * t[1] + t[2] * t[2]))
            if not abs(det) > 1e-9 * scale:
                ok = False
                break
            out_vx[i, v, 0] = (p[3] * qr0 + q[3] * rp0 + t[3] * pq0) / det
            out_vx[i, v, 1] = (p[3] * qr1 + q[3] * rp1 + t[3] * pq1) / det
            out_vx[i, v, 2] = (p[3] * qr2 + q[3] * rp2 + t[3] * pq2) / det
        if ok:
            for v in range(m):
                for k in range(3):
                    w = adjacent[i, v, k]
                    pl = planes[v, k]
                    f0, f1, f2 = out_vx[i, w, 0], out_vx[i, w, 1], out_vx[i, w, 2]
                    gap = pl[0] * f0 + pl[1] * f1 + pl[2] * f2 - pl[3]
                    tol = 64.0 * eps * (abs(pl[3]) + np.sqrt((pl[0] * pl[0] + pl[1] * pl[1] + pl[2] * pl[2])
                                                             * (f0 * f0 + f1 * f1 + f2 * f2)))
                    if not gap < -tol:
                        ok = False
                        break
                if not ok:
                    break
        out_valid[i] = ok
        if ok:
            out_volume[i] = ph.volume(out_vx[i], corners[i], adjacent[i], m, ref)


def tiles(volume, lo, hi):
    """Whether the cells' volumes add up to the box's, up to rounding (the certificate)."""
    box = float(np.prod(np.asarray(hi) - np.asarray(lo)))
    total = float(np.sum(volume))
    tol = 64.0 * 2.0 ** -52 * (box + float(np.sum(np.abs(volume)))) * max(1.0, volume.shape[0] ** 0.5)
    return abs(total - box) <= tol


def power_cells(seeds, psi, active, lo, hi, capacity, previous=None, *, options):
    """Every cell (NumPy in and out), see the module docstring: ``(vertices, corners, adjacent,
    size, labels, count, status)`` in the layout of :class:`..spatial.polyhedra.Cells` with
    ``capacity`` facet slots (``3 capacity / 2`` vertex slots) and per cell :data:`FINE`,
    :data:`OVERFLOWED` or :data:`BROKEN`. ``previous``: the diagram of the same seeds at other
    weights, ``(vertices, corners, adjacent, size, labels, count)``; ``options``: the
    thresholds between the ways (``sdot._core.options.CellOptions``)."""
    from . import run_rows

    n = seeds.shape[0]
    seeds, psi, active, lo, hi, previous = kernel_inputs(seeds, psi, active, lo, hi, previous)
    if previous is not None:
        if previous[4].shape[1] == capacity:
            found = _moved_or_ring(seeds, psi, active, lo, hi, previous, run_rows, options)
            if found is not None:
                return found
    hints = None if previous is None else previous[4]
    if hints is None and n >= options.nearest_from and _equal_weights(psi, active):
        hints = _nearest(seeds, active, options.nearest)
    out = _empty(n, capacity)
    _clip(seeds, psi, active, lo, hi, hints, False, np.arange(n), out, run_rows)
    return out[:7]


def _equal_weights(psi, active):
    """Whether the active seeds' weights are all equal (a Voronoi diagram)."""
    w = psi[active]
    return w.shape[0] > 0 and w.min() == w.max()


def _nearest(seeds, active, k):
    """The ``k`` nearest active seeds of each seed (itself first among them, if
    active; -1 where fewer): the hints of a Voronoi diagram, from the k-d tree of the cells."""
    from . import run_rows, tree

    perm, start, end, lo, hi = _tree_of(seeds, active)
    points = np.ascontiguousarray(seeds[perm])
    hints = np.full((seeds.shape[0], k + 1), -1, np.int64)
    rows = _in_leaf_order(np.arange(seeds.shape[0]), perm, _rank(perm, seeds.shape[0]))   # (for the caches)
    run_rows(lambda first, last: tree.nearest_rows(first, last, rows, seeds, perm, start, end, lo, hi, points, hints,
                                                   np.empty(k + 1), np.empty(256, np.int64)),
             rows.shape[0])
    return hints


def kernel_inputs(seeds, psi, active, lo, hi, previous):
    """The arguments of ``power_cells`` (2D and 3D) as the kernels read them: contiguous, in
    float64 (``active`` in bool)."""
    c = np.ascontiguousarray
    previous = None if previous is None else tuple(c(a) for a in previous)
    return (c(seeds, dtype=np.float64), c(psi, dtype=np.float64), c(active, dtype=np.bool_), c(lo, dtype=np.float64),
            c(hi, dtype=np.float64), previous)


def _empty(n, capacity):
    """Output arrays of :func:`cells_rows` for ``n`` cells of ``capacity`` facet slots."""
    v_cap = 3 * capacity // 2
    return (np.zeros((n, v_cap, 3)), np.zeros((n, v_cap, 3), np.int64), np.zeros((n, v_cap, 3), np.int64),
            np.zeros(n, np.int64), np.full((n, capacity), UNUSED, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int8),
            np.zeros(n))


def _clip(seeds, psi, active, lo, hi, hints, ring, rows, out, run_rows):
    """:func:`cells_rows` of the seeds ``rows`` into ``out`` (the tree unless ``ring``), in the
    order of the tree's leaves (:func:`clip_order`)."""
    from sdot._core.cube import corners_planes_adjacent      # the layout of the array kernels' cells

    n = seeds.shape[0]
    hints, perm, rank, rows, points, weights, *bounds = clip_order(seeds, psi, active, hints, ring, rows)
    cube = tuple(np.asarray(a, dtype=t) for a, t in zip(corners_planes_adjacent(), (np.float64, np.int64, np.int64)))
    run_rows(lambda first, last: cells_rows(first, last, rows, seeds, psi, active, lo, hi, hints, ring, perm, rank, points,
                                            weights, *bounds, *cube, *out, *scratch(n + 1)),
             rows.shape[0])


def clip_order(seeds, psi, active, hints, ring, rows):
    """What the clipping kernels of 2D and 3D read: ``(hints, perm, rank, rows, points, weights,
    start, end, nlo, nhi, g, big)``, the ``rows`` sorted in the order of the tree's leaves
    (neighbouring cells one after the other: at 1e5 seeds the seeds' order took twice as long,
    for the caches), the seeds and weights in that order, the tree and its nodes' fitted planes
    (none when ``ring`` and every cell has hints)."""
    from . import tree

    n, dim = seeds.shape
    hints = np.zeros((n, 0), np.int64) if hints is None else np.ascontiguousarray(hints, dtype=np.int64)
    perm, start, end, nlo, nhi = _tree_of(seeds, active)
    rank = _rank(perm, n)
    rows = _in_leaf_order(rows, perm, rank)
    points, weights = np.ascontiguousarray(seeds[perm]), np.ascontiguousarray(psi[perm])
    if ring and _all_hinted(hints, active, rows):
        g, big = np.zeros((0, dim)), np.zeros(0)
        start = end = np.zeros(0, np.int64)
    else:
        g, big = tree.planes(start, end, points, weights)
    return hints, perm, rank, rows, points, weights, start, end, nlo, nhi, g, big


def _rank(perm, n):
    """The place of each of ``n`` seeds in the tree's order ``perm`` (``n`` for those outside)."""
    rank = np.full(n, n, np.int64)
    rank[perm] = np.arange(perm.shape[0])
    return rank


def _in_leaf_order(rows, perm, rank):
    """The ``rows`` (distinct) in the order of the tree's leaves (``perm``), the rows outside it
    (``rank`` n) after them in their order: a stable sort by ``rank`` in linear time."""
    n = rank.shape[0]
    chosen = np.zeros(n, np.bool_)
    chosen[rows] = True
    outside = rows[rank[rows] == n]
    return np.ascontiguousarray(np.concatenate([perm[chosen[perm]], outside]), dtype=np.int64)


@njit
def _all_hinted(hints, active, rows):
    """Whether every active one of the ``rows`` has an active seed among its ``hints``."""
    for i in rows:
        if not active[i]:
            continue
        found = False
        for j in hints[i]:
            if j >= 0 and active[j]:
                found = True
                break
        if not found:
            return False
    return True


_trees = []


def _tree_of(seeds, active):
    """The k-d tree of the active ``seeds`` (:func:`.tree.build`), the last one kept: the
    positions of a solve do not change from one diagram to the next."""
    from . import tree

    key = (seeds.shape, hash(seeds.tobytes()), hash(active.tobytes()))
    if not _trees or _trees[0][0] != key:
        _trees[:] = [(key, tree.build(seeds, np.flatnonzero(active), LEAF))]
    return _trees[0][1]


def _moved_or_ring(seeds, psi, active, lo, hi, previous, run_rows, options):
    """The previous cells moved (1 of the module docstring), the invalid ones and their
    neighbours reclipped by the ring (2), if the certificate accepts them; else None.

    An active cell that was empty has no neighbours to move or to ring: it is clipped by the
    tree (cheaply emptied again, most often), and it does not count among the invalid ones
    (the images of a periodic diagram, :mod:`sdot._core.periodic`: a fifth of the sites in
    3D). Where it reappears, the cells it cuts did not know it: they are clipped again by the
    tree (:func:`_repaired`)."""
    vertices, corners, adjacent, size, labels, count = previous
    n, v_cap, _ = vertices.shape
    moved_vx = np.zeros_like(vertices, dtype=np.float64)
    valid = np.empty(n, np.bool_)
    volume = np.empty(n)
    was_empty = active & (size == 0)

    def move(first, last, step=1):
        moved_rows(first, last, seeds, psi, active, lo, hi, vertices, corners, adjacent, size, labels, moved_vx,
                   valid, volume, np.empty((v_cap, 3, 4)), np.empty(labels.shape[1], np.int64), step)

    step = max(1, n // options.probe)           # a sample first: most cells invalid, no need to move all
    move(0, n, step)
    if (~valid[::step] & ~was_empty[::step]).mean() <= 2 * options.ring_share:
        run_rows(move, n)
        bad = np.flatnonzero(~valid & ~was_empty)
    else:
        bad = None
    status = np.zeros(n, np.int8)
    emptied = np.flatnonzero(was_empty)
    if (bad is not None and bad.shape[0] == 0 and not _reappear(seeds, psi, active, lo, hi, emptied, labels.shape[1],
                                                                run_rows) and tiles(volume, lo, hi)):
        return moved_vx, corners, adjacent, size, labels, count, status
    if bad is None or bad.shape[0] > options.ring_share * n:   # every cell by the ring
        rows = np.arange(n)
        moved_vx = None                         # freed first (at 1e6 seeds, 1.7 GB)
        out = _empty(n, labels.shape[1])
    else:
        around = labels[bad]
        rows = np.unique(np.concatenate([bad, around[around >= 0], emptied]))
        out = (moved_vx, corners.copy(), adjacent.copy(), size.copy(), labels.copy(), count.copy(), status, volume)
    _clip(seeds, psi, active, lo, hi, labels, True, rows, out, run_rows)
    return _repaired(seeds, psi, active, lo, hi, out, run_rows, emptied)


def _reappear(seeds, psi, active, lo, hi, rows, capacity, run_rows):
    """Whether a cell of the ``rows`` (empty in the previous diagram) is not empty, clipped by
    the tree (into arrays of which only those rows are written: their zeros cost no memory)."""
    if rows.shape[0] == 0:
        return False
    out = _empty(seeds.shape[0], capacity)
    _clip(seeds, psi, active, lo, hi, None, False, rows, out, run_rows)
    return bool((out[3][rows] > 0).any() | (out[6][rows] != FINE).any())


def _repaired(seeds, psi, active, lo, hi, out, run_rows, emptied=None):
    """The cells ``out`` (moved or clipped by the ring) if the certificate accepts them once
    the cells that failed or that a neighbour contradicts (:mod:`.agreement`) are clipped again
    by the tree, and the neighbours of the cells that were ``emptied`` and reappear; else
    None. (After the first Newton steps of a 3D box solve at 1e5 seeds, the ring missed a seed
    in 50 and 2 cells, and 139 and 4 were contradicted.)"""
    from .agreement import contradicted

    status, volume, size, labels = out[6], out[7], out[3], out[4]
    back = np.zeros(0, np.int64) if emptied is None else emptied[size[emptied] > 0]
    if back.shape[0]:
        cut = labels[back]
        _clip(seeds, psi, active, lo, hi, None, False, np.unique(cut[cut >= 0]), out, run_rows)
    if (status == FINE).all() and tiles(volume, lo, hi):
        return out[:7]
    rows = np.flatnonzero((status != FINE) | contradicted(out[1], out[3], out[4], run_rows))
    if rows.shape[0] == 0:
        return None
    _clip(seeds, psi, active, lo, hi, None, False, rows, out, run_rows)
    if (status != FINE).any() or not tiles(volume, lo, hi):
        return None
    return out[:7]


def scratch(n):
    """The scratch arrays of :func:`cells_rows` (one set per thread)."""
    v = 2 * SCRATCH_FACETS
    return (np.empty((v, 3)), np.empty((v, 3), np.int64), np.empty((v, 3), np.int64), np.empty(SCRATCH_FACETS, np.int64),
            np.empty(v), np.full(SCRATCH_FACETS + 1, -1, np.int64), np.full(SCRATCH_FACETS + 1, -1, np.int64),
            np.empty(v, np.int64), np.empty(3 * v, np.int64), np.empty(3 * v, np.int64), np.empty((3 * v, 3)),
            np.full(n, -1, np.int64), np.empty(256, np.int64), np.empty(3), np.empty(7))
