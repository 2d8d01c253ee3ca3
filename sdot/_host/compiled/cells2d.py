"""Power cells in 2D, each clipped on its own from the box (numba, rows on the host's threads).

The three ways of :mod:`.cells3d`, with polygons (:mod:`.polygon`): the previous cells **moved**
(each vertex the meeting point of its two edges' lines at the new weights) while every edge
keeps a positive length; the invalid ones and their neighbours (or every cell) clipped again by
the **ring** of their neighbours and their neighbours' neighbours; else every cell clipped by
its previous neighbours and the seeds of the k-d **tree** (:mod:`.tree`) that may cut it. The
first two are certified by the area sum (the cells contain the true ones, which tile the box).

Output: the layout of :class:`..planar.polygons.Cells`.
"""
from __future__ import annotations

import numpy as np

from . import polygon as pg
from ._numba import njit
from .cells3d import BROKEN, FINE, LEAF, OVERFLOWED  # noqa: F401 (the same codes)

#: Vertex slots of a cell while it is clipped.
SCRATCH = 512


@njit
def _box_distance2(p0, p1, lo, hi, k):
    g = max(lo[k, 0] - p0, p0 - hi[k, 0], 0.0)
    d = g * g
    g = max(lo[k, 1] - p1, p1 - hi[k, 1], 0.0)
    return d + g * g


@njit
def _cannot_cut(px, py, m, y0, y1, w, shape, lo, hi, g, big, k):
    """Whether no seed under node ``k`` cuts the cell: :func:`.cells3d._cannot_cut` in 2D."""
    r2 = shape[0]
    h0, h1 = 0.5 * g[k, 0], 0.5 * g[k, 1]
    gy = g[k, 0] * y0 + g[k, 1] * y1
    # (with a rounding margin: beside a Dirac 1e6 away the terms reach 1e12)
    own = r2 - w + 64.0 * 2.0 ** -52 * (abs(gy) + abs(big[k]) + abs(w) + r2 + y0 * y0 + y1 * y1)
    d2 = _box_distance2(y0 + h0, y1 + h1, lo, hi, k)
    if d2 > r2:
        radius = np.sqrt(r2)
        gap = np.sqrt(d2) - radius
        if gap * gap - gy - 2.0 * np.sqrt(h0 * h0 + h1 * h1) * radius - big[k] >= own:
            return True
    g0 = max(lo[k, 0] - (y0 + h0 + shape[2]), (y0 + h0 + shape[1]) - hi[k, 0], 0.0)
    g1 = max(lo[k, 1] - (y1 + h1 + shape[4]), (y1 + h1 + shape[3]) - hi[k, 1], 0.0)
    support = 2.0 * (max(h0 * shape[1], h0 * shape[2]) + max(h1 * shape[3], h1 * shape[4]))
    if g0 * g0 + g1 * g1 - gy - support - big[k] >= own:
        return True
    for v in range(m):
        x0, x1 = px[v], py[v]
        bound = _box_distance2(y0 + x0 + h0, y1 + x1 + h1, lo, hi, k) - gy - 2.0 * (h0 * x0 + h1 * x1) - big[k]
        if bound < x0 * x0 + x1 * x1 + own - r2:
            return False
    return True


@njit
def _clip_by_seed(px, py, lab, m, points, weights, t, j, y0, y1, w, shape, qx, qy, qlab, s, measured):
    """The cell (about ``(y0, y1)``, weight ``w``) clipped by seed ``j`` at ``points[t]``
    (weight ``weights[t]``) into ``(qx, qy, qlab)``, unless the sphere through the farthest
    vertex or the vertices' box lie inside (``measured``: ``shape`` is up to date); ``(count,
    status)``, ``shape`` measured again on a change."""
    d0 = points[t, 0] - y0
    d1 = points[t, 1] - y1
    dd = d0 * d0 + d1 * d1
    off = 0.5 * (dd + w - weights[t])
    if measured:
        if off > 0.0 and off * off > shape[0] * dd:
            return m, pg.UNCHANGED
        if max(shape[1] * d0, shape[2] * d0) + max(shape[3] * d1, shape[4] * d1) <= off:
            return m, pg.UNCHANGED
    # (no rounding margin: in 2D rounding cannot break a polygon, and beside a Dirac 1e6 away
    # a margin of 64 units in the last place kept vertices the plane cuts 1e-8 deep)
    count, status = pg.clip(px, py, lab, m, d0, d1, off, j, 0.0, qx, qy, qlab, s)
    if status == pg.CHANGED and measured:
        pg.measure(qx, qy, count, shape)
    return count, status


@njit
def cells_rows(first, last, rows, seeds, psi, active, box_lo, box_hi, hints, ring, perm, rank, points, weights,
               start, end, lo, hi, g, big, out_vx, out_lab, out_count, out_status, out_area,
               ax, ay, alab, bx, by, blab, s, stamp, stack, shape):
    """The cells of the seeds ``rows[first:last]``: :func:`.cells3d.cells_rows` in 2D (``ax`` ...
    ``shape``: :func:`scratch`, two polygons that take turns)."""
    n_nodes = start.shape[0]
    first_leaf = (n_nodes - 1) // 2
    v_out = out_vx.shape[1]
    for r in range(first, last):
        i = rows[r]
        out_status[i] = FINE
        out_area[i] = 0.0
        out_count[i] = 0
        for k in range(v_out):
            out_lab[i, k] = -5
        if not active[i]:
            continue
        y0, y1, w = seeds[i, 0], seeds[i, 1], psi[i]
        px, py, lab, qx, qy, qlab = ax, ay, alab, bx, by, blab
        m = pg.start_box(px, py, lab, box_lo, box_hi, y0, y1)
        pg.measure(px, py, m, shape)
        status = pg.UNCHANGED
        stamp[rank[i]] = i
        hinted = False
        for h in range(hints.shape[1]):
            j = hints[i, h]
            if j < 0 or not active[j] or stamp[rank[j]] == i:
                continue
            stamp[rank[j]] = i
            hinted = True
            m, status = _clip_by_seed(px, py, lab, m, points, weights, rank[j], j, y0, y1, w, shape, qx, qy, qlab, s,
                                      False)
            if status == pg.CHANGED:
                px, py, lab, qx, qy, qlab = qx, qy, qlab, px, py, lab
            elif status >= pg.EMPTIED:
                break
        pg.measure(px, py, m, shape)
        if ring and hinted:
            for h in range(hints.shape[1]):
                a = hints[i, h]
                if a < 0 or status >= pg.EMPTIED:
                    continue
                for h2 in range(hints.shape[1]):
                    j = hints[a, h2]
                    if j < 0 or not active[j] or stamp[rank[j]] == i:
                        continue
                    stamp[rank[j]] = i
                    m, status = _clip_by_seed(px, py, lab, m, points, weights, rank[j], j, y0, y1, w, shape, qx, qy,
                                              qlab, s, True)
                    if status == pg.CHANGED:
                        px, py, lab, qx, qy, qlab = qx, qy, qlab, px, py, lab
                    elif status >= pg.EMPTIED:
                        break
        depth = 0
        if status < pg.EMPTIED and n_nodes > 0 and not (ring and hinted):
            stack[0] = 0
            depth = 1
        while depth > 0:
            depth -= 1
            k = stack[depth]
            if end[k] <= start[k] or _cannot_cut(px, py, m, y0, y1, w, shape, lo, hi, g, big, k):
                continue
            if k >= first_leaf:
                for t in range(start[k], end[k]):
                    if stamp[t] == i:
                        continue
                    stamp[t] = i
                    m, status = _clip_by_seed(px, py, lab, m, points, weights, t, perm[t], y0, y1, w, shape, qx, qy,
                                              qlab, s, True)
                    if status == pg.CHANGED:
                        px, py, lab, qx, qy, qlab = qx, qy, qlab, px, py, lab
                    elif status >= pg.EMPTIED:
                        break
                if status >= pg.EMPTIED:
                    break
            else:
                near, far = 2 * k + 1, 2 * k + 2
                if _box_distance2(y0, y1, lo, hi, near) > _box_distance2(y0, y1, lo, hi, far):
                    near, far = far, near
                if depth + 2 > stack.shape[0]:
                    status = pg.OVERFLOW
                    break
                stack[depth] = far
                stack[depth + 1] = near
                depth += 2
        if status == pg.EMPTIED:
            continue
        if status == pg.OVERFLOW or m > v_out:
            out_status[i] = OVERFLOWED
            continue
        for k in range(m):
            out_vx[i, k, 0] = px[k]
            out_vx[i, k, 1] = py[k]
            out_lab[i, k] = lab[k]
        out_count[i] = m
        out_area[i] = pg.area(px, py, m)


@njit
def _line(seeds, psi, i, label, box_lo, box_hi):
    """The line ``u . n = b`` (about seed ``i``) of edge ``label``: ``(n0, n1, b)``."""
    if label >= 0:
        d0 = seeds[label, 0] - seeds[i, 0]
        d1 = seeds[label, 1] - seeds[i, 1]
        return d0, d1, 0.5 * (d0 * d0 + d1 * d1 + psi[i] - psi[label])
    side = -1 - label
    if side == 0:
        return 0.0, -1.0, seeds[i, 1] - box_lo[1]
    if side == 1:
        return 1.0, 0.0, box_hi[0] - seeds[i, 0]
    if side == 2:
        return 0.0, 1.0, box_hi[1] - seeds[i, 1]
    return -1.0, 0.0, seeds[i, 0] - box_lo[0]


@njit
def moved_rows(first, last, seeds, psi, active, box_lo, box_hi, vertices, labels, count, out_vx, out_valid,
               out_area, lines):
    """The cells ``first .. last - 1`` of a previous diagram (``vertices``, ``labels``, ``count``)
    with each vertex moved to the meeting point of its two edges' lines at the weights ``psi``,
    into ``out_vx``; ``out_valid``: every vertex well defined and every edge of positive length
    along its line (an active cell that was empty is not valid); ``out_area``. ``lines``
    (V, 3): scratch. A cell far from its seed (beyond twice the box's diagonal) is not valid:
    its lines are nearly parallel (a Dirac 1e6 away stalled), it is clipped again."""
    eps = 2.0 ** -52
    far2 = _far2(box_lo, box_hi)
    for i in range(first, last):
        m = count[i]
        out_area[i] = 0.0
        if m == 0:
            out_valid[i] = not active[i]
            continue
        if vertices[i, 0, 0] ** 2 + vertices[i, 0, 1] ** 2 > far2:
            out_valid[i] = False                # far from its seed: nearly parallel lines, clipped again
            continue
        for k in range(m):
            lines[k, 0], lines[k, 1], lines[k, 2] = _line(seeds, psi, i, labels[i, k], box_lo, box_hi)
        ok = True
        for k in range(m):
            p = k - 1 if k > 0 else m - 1                    # the edge that ends at vertex k
            n0, n1, b0 = lines[p, 0], lines[p, 1], lines[p, 2]
            e0, e1, b1 = lines[k, 0], lines[k, 1], lines[k, 2]
            det = n0 * e1 - n1 * e0
            if not abs(det) > 1e-9 * np.sqrt((n0 * n0 + n1 * n1) * (e0 * e0 + e1 * e1)):
                ok = False
                break
            out_vx[i, k, 0] = (b0 * e1 - b1 * n1) / det
            out_vx[i, k, 1] = (n0 * b1 - e0 * b0) / det
        if ok:
            for k in range(m):
                kn = k + 1 if k + 1 < m else 0
                t0, t1 = -lines[k, 1], lines[k, 0]           # along edge k, counter-clockwise
                u0 = out_vx[i, kn, 0] - out_vx[i, k, 0]
                u1 = out_vx[i, kn, 1] - out_vx[i, k, 1]
                scale = np.sqrt((t0 * t0 + t1 * t1) * (out_vx[i, k, 0] ** 2 + out_vx[i, k, 1] ** 2
                                                       + out_vx[i, kn, 0] ** 2 + out_vx[i, kn, 1] ** 2))
                if not u0 * t0 + u1 * t1 > 64.0 * eps * scale:
                    ok = False
                    break
        out_valid[i] = ok
        if ok:
            out_area[i] = pg.area(out_vx[i, :, 0], out_vx[i, :, 1], m)


@njit
def disagreeing(first, last, labels, count, out):
    """``out[i]``: whether a vertex of cell ``i`` between two neighbours ``a`` and ``b`` is not a
    vertex of ``a`` between ``i`` and ``b`` too (a cell that misses a neighbour, or a neighbour
    that misses it: the cells' combinatorics disagree there)."""
    for i in range(first, last):
        out[i] = False
        m = count[i]
        for k in range(m):
            a = labels[i, k - 1 if k > 0 else m - 1]
            b = labels[i, k]
            if a < 0 or b < 0:
                continue
            ma = count[a]
            found = False
            for t in range(ma):
                c, d = labels[a, t - 1 if t > 0 else ma - 1], labels[a, t]
                if (c == i and d == b) or (c == b and d == i):
                    found = True
                    break
            if not found:
                out[i] = True
                break


@njit
def _far2(box_lo, box_hi):
    """The squared distance from a seed beyond which its cell is far: twice the box's diagonal."""
    d = 0.0
    for a in range(box_lo.shape[0]):
        d += (box_hi[a] - box_lo[a]) ** 2
    return 4.0 * d


def power_cells(seeds, psi, active, lo, hi, capacity, previous=None, *, options):
    """Every cell (NumPy in and out), see the module docstring: ``(vertices, labels, count,
    status)`` in the layout of :class:`..planar.polygons.Cells` with ``capacity`` vertex slots,
    per cell :data:`FINE` or :data:`OVERFLOWED`. ``previous``: the diagram of the same seeds at
    other weights, ``(vertices, labels, count)``; ``options``: the thresholds between the ways
    (``sdot._core.options.CellOptions``)."""
    from . import run_rows

    from .cells3d import kernel_inputs

    n = seeds.shape[0]
    seeds, psi, active, lo, hi, previous = kernel_inputs(seeds, psi, active, lo, hi, previous)
    if previous is not None:
        if previous[1].shape[1] == capacity:
            found = _moved_or_ring(seeds, psi, active, lo, hi, previous, run_rows, options)
            if found is not None:
                return found
    hints = None if previous is None else previous[1]
    out = _empty(n, capacity)
    _clip(seeds, psi, active, lo, hi, hints, False, np.arange(n), out, run_rows)
    return out[:4]


def _empty(n, capacity):
    """Output arrays of :func:`cells_rows` for ``n`` cells of ``capacity`` vertex slots."""
    return (np.zeros((n, capacity, 2)), np.full((n, capacity), -5, np.int64), np.zeros(n, np.int64),
            np.zeros(n, np.int8), np.zeros(n))


def _clip(seeds, psi, active, lo, hi, hints, ring, rows, out, run_rows):
    """:func:`cells_rows` of the seeds ``rows`` into ``out``, in the tree's order
    (:func:`.cells3d.clip_order`)."""
    from .cells3d import clip_order

    n = seeds.shape[0]
    hints, perm, rank, rows, points, weights, *bounds = clip_order(seeds, psi, active, hints, ring, rows)
    run_rows(lambda first, last: cells_rows(first, last, rows, seeds, psi, active, lo, hi, hints, ring, perm, rank, points,
                                            weights, *bounds, *out, *scratch(n + 1)),
             rows.shape[0])


def _moved_or_ring(seeds, psi, active, lo, hi, previous, run_rows, options):
    """The previous cells moved, or clipped by the ring, if the area sum certifies them; else
    None. An active cell that was empty is clipped by the tree, not counted among the invalid
    ones; where it reappears, the cells it cuts are clipped again by the tree (as in 3D,
    :func:`.cells3d._moved_or_ring`)."""
    from .cells3d import tiles

    vertices, labels, count = previous
    n, v_cap, _ = vertices.shape
    moved_vx = np.zeros((n, v_cap, 2))
    valid = np.empty(n, np.bool_)
    area = np.empty(n)
    run_rows(lambda first, last: moved_rows(first, last, seeds, psi, active, lo, hi, vertices, labels, count, moved_vx,
                                            valid, area, np.empty((v_cap, 3))), n)
    was_empty = active & (count == 0)
    bad = np.flatnonzero(~valid & ~was_empty)
    emptied = np.flatnonzero(was_empty)
    status = np.zeros(n, np.int8)
    if bad.shape[0] == 0 and not _reappear(seeds, psi, active, lo, hi, emptied, v_cap, run_rows) and tiles(area, lo, hi):
        return moved_vx, labels, count, status
    if bad.shape[0] > options.ring_all * n:
        return None
    if bad.shape[0] > options.ring_share * n:
        rows = np.arange(n)
        moved_vx = None                         # freed first
        out = _empty(n, v_cap)
    else:
        around = labels[bad]
        rows = np.unique(np.concatenate([bad, around[around >= 0], emptied]))
        out = (moved_vx, labels.copy(), count.copy(), status, area)
    _clip(seeds, psi, active, lo, hi, labels, True, rows, out, run_rows)
    if (out[3] != FINE).any():
        return None
    back = emptied[out[2][emptied] > 0]
    if back.shape[0] or not tiles(out[4], lo, hi):
        # a few cells gained a neighbour beyond the ring, or one that reappeared: those whose
        # vertices disagree with their neighbours', the reappeared ones' neighbours, and their
        # neighbours, by the tree
        flags = np.empty(n, np.bool_)
        run_rows(lambda first, last: disagreeing(first, last, out[1], out[2], flags), n)
        cut = out[1][back]
        flags[cut[cut >= 0]] = True
        suspects = np.flatnonzero(flags)
        if suspects.shape[0] > options.ring_share * n:
            return None
        around = out[1][suspects]
        rows = np.unique(np.concatenate([suspects, around[around >= 0]]))
        if rows.shape[0]:
            _clip(seeds, psi, active, lo, hi, None, False, rows, out, run_rows)
        if (out[3] != FINE).any() or not tiles(out[4], lo, hi):
            return None
    return out[:4]


def _reappear(seeds, psi, active, lo, hi, rows, capacity, run_rows):
    """Whether a cell of the ``rows`` (empty in the previous diagram) is not empty, clipped by
    the tree (into arrays of which only those rows are written)."""
    if rows.shape[0] == 0:
        return False
    out = _empty(seeds.shape[0], capacity)
    _clip(seeds, psi, active, lo, hi, None, False, rows, out, run_rows)
    return bool((out[2][rows] > 0).any() | (out[3][rows] != FINE).any())


def scratch(n):
    """The scratch arrays of :func:`cells_rows` (one set per thread)."""
    v = SCRATCH
    return (np.empty(v), np.empty(v), np.empty(v, np.int64), np.empty(v), np.empty(v), np.empty(v, np.int64),
            np.empty(v), np.full(n, -1, np.int64), np.empty(256, np.int64), np.empty(5))
