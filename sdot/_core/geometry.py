"""Power (Laguerre) diagrams in 2D by vectorised half-plane clipping.

Cell ``i`` of seeds ``y`` with weights ``psi`` is

    L_i = { x in box : |x - y_i|^2 - psi_i <= |x - y_j|^2 - psi_j  for all j }.

In seed-relative coordinates ``u = x - y_i`` the constraint of seed j is the
half-plane ``u . d <= (|d|^2 + psi_i - psi_j) / 2`` with ``d = y_j - y_i``.

1. Every cell starts as the box and is clipped by its *candidates*: the
   neighbours in the previous diagram of the Newton loop (the combinatorics
   barely change between steps), or the k nearest seeds for a first diagram.
2. Certificate: a cell clipped by a subset of its constraints contains the
   true cell, and the true cells tile the box, so ``sum_i area(P_i) >= area(box)``
   with equality iff every ``P_i`` is exact. Checked up to rounding.
3. Repair, while the certificate fails: each vertex of cell i, where the edges
   of neighbours j and k meet, is tested against the neighbours of k (the
   local regularity test of the dual triangle ijk); a seed of lower power
   there cuts the cell. If no such local cutter exists, every vertex is
   tested exactly: the seed of least power at ``v`` is the nearest lifted seed
   ``(y_j, sqrt(M - psi_j))`` to ``(v, 0)``, ``M = max psi``.

Cells are polygons of fixed capacity ``V`` (vertices counter-clockwise,
relative to the seed); each vertex carries the label of the edge that starts
at it: the neighbour ``j >= 0``, or ``-1 - side`` for a side of the box
(0: y = lo, 1: x = hi, 2: y = hi, 3: x = lo). Shapes are static; eagerly the
repairs only touch the cells that need them, a capacity overflow is retried
with twice the capacity; under tracing ``overflow`` and ``certified`` report
what could not be done.
"""
from __future__ import annotations

from typing import NamedTuple

import array_api_compat as aac

from . import _compat

#: Nearest seeds used as candidates for a diagram without a previous one (without a host;
#: with one, the Delaunay neighbours, at most ``FIRST_CANDIDATES + 4`` under tracing).
FIRST_CANDIDATES = 12
#: Vertex capacity per cell (doubled eagerly on overflow).
CAPACITY = 16
#: Neighbours per cell in the table of the local test (a hint: enough for most cells).
TABLE_WIDTH = 10
#: Seeds a cell may gain by edge flips in one update (more are left to the repair).
FLIP_WIDTH = 4
#: Maximum number of repair rounds.
ROUNDS = 32


class Cells(NamedTuple):
    """Clipped cells: ``vertices`` (n, V, 2) relative to the seeds, ``labels`` (n, V),
    ``count`` (n,); ``overflow`` (n,) and ``certified`` () flags."""

    vertices: object
    labels: object
    count: object
    overflow: object
    certified: object


# ------------------------------------------------------------------ kernels
def box_cells(xp, seeds, lo, hi, active, capacity: int):
    """Every active cell starts as the box ``[lo, hi]``, inactive cells empty."""
    n = seeds.shape[0]
    dev = aac.device(seeds)
    corners = xp.stack([
        xp.stack([lo[0], lo[1]]), xp.stack([hi[0], lo[1]]),
        xp.stack([hi[0], hi[1]]), xp.stack([lo[0], hi[1]]),
    ])                                                     # (4, 2) counter-clockwise
    pad = xp.zeros((capacity - 4, 2), dtype=seeds.dtype, device=dev)
    verts = xp.concat([corners, pad], axis=0)[None, :, :] - seeds[:, None, :]
    side = xp.asarray([-1, -2, -3, -4] + [-5] * (capacity - 4), dtype=xp.int64, device=dev)
    labels = xp.broadcast_to(side[None, :], (n, capacity))
    count = 4 * xp.astype(active, xp.int64)
    return Cells(verts, labels, count, xp.zeros((n,), dtype=xp.bool, device=dev),
                 xp.asarray(False, device=dev))


def _gather(x, idx):
    """``x[r, idx[r, ...]]`` row by row (``x`` of shape (n, V) or (n, V, 2))."""
    xp = aac.array_namespace(x)
    if x.ndim == 3:
        flat = xp.reshape(idx, (idx.shape[0], -1))
        out = xp.stack([xp.take_along_axis(x[..., c], flat, axis=1) for c in range(x.shape[2])], axis=-1)
        return xp.reshape(out, tuple(idx.shape) + (x.shape[2],))
    flat = xp.reshape(idx, (idx.shape[0], -1))
    return xp.reshape(xp.take_along_axis(x, flat, axis=1), tuple(idx.shape))


@_compat.jit_on_jax()
def clip_polygons(xp, verts, labels, count, normal, offset, label, skip):
    """Clip each polygon by its half-plane ``u . normal <= offset``.

    Returns the new ``(verts, labels, count, overflow)``; ``skip`` rows are
    unchanged. A half-plane cuts a convex polygon along one run of vertices
    ``a, ..., b - 1`` (the first run that starts after an inside vertex):
    the new polygon is the exit point on edge ``(a - 1, a)`` (labelled
    ``label``), the entry point on edge ``(b - 1, b)``, then ``b, ..., a - 1``,
    a rotation read with one gather.
    """
    n, cap, _ = verts.shape
    dev = aac.device(verts)
    k = xp.arange(cap, dtype=xp.int64, device=dev)[None, :]
    valid = k < count[:, None]
    cnt = xp.maximum(count, 1)[:, None]
    s = xp.sum(verts * normal[:, None, :], axis=-1) - offset[:, None]
    out = valid & (s > 0) & ~skip[:, None]
    changed = xp.any(out, axis=1)
    out_prev = _gather(out, (k - 1 + cnt) % cnt)
    a = xp.argmax(xp.astype(out & ~out_prev, xp.int8), axis=1)[:, None]
    run = xp.where(valid & ~out, (k - a + cnt) % cnt, cap)   # distance from a of inside vertices
    length = xp.min(run, axis=1, keepdims=True)
    empty = changed & (length[:, 0] >= cap)
    b = (a + length) % cnt
    ends = xp.concat([(a - 1 + cnt) % cnt, a, (b - 1 + cnt) % cnt, b], axis=1)   # (n, 4)
    sv, vv = _gather(s, ends), _gather(verts, ends)
    den = sv[:, 0::2] - sv[:, 1::2]                    # exit < 0, entry > 0 where a run is cut
    den = xp.where((changed & ~empty)[:, None] & (den != 0), den, 1.0)
    ratio = (sv[:, 0::2] / den)[..., None]
    x1 = vv[:, 0, :] + ratio[:, 0, :] * (vv[:, 1, :] - vv[:, 0, :])
    x2 = vv[:, 2, :] + ratio[:, 1, :] * (vv[:, 3, :] - vv[:, 2, :])
    src = (b + k - 2 + 2 * cnt) % cnt
    new_v = _gather(verts, src)
    new_l = _gather(labels, src)
    first, second = (k == 0)[..., None], (k == 1)[..., None]
    new_v = xp.where(first, x1[:, None, :], xp.where(second, x2[:, None, :], new_v))
    entry_label = _gather(labels, ends[:, 2:3])
    new_l = xp.where(k == 0, label[:, None], xp.where(k == 1, entry_label, new_l))
    new_count = count - length[:, 0] + 2
    overflow = changed & ~empty & (new_count > cap)
    keep = ~changed[:, None]
    verts = xp.where(keep[..., None], verts, new_v)
    labels = xp.where(keep, labels, new_l)
    count = xp.where(empty, 0, xp.where(changed, xp.minimum(new_count, cap), count))
    return verts, labels, count, overflow


@_compat.jit_on_jax()
def _half_planes(xp, seeds, psi, active, count, rows, j):
    """Half-planes ``u . normal <= offset`` of the seeds ``j`` for the cells of ``rows``,
    and which to skip (-1, the cell itself, inactive seeds, empty cells)."""
    none = j < 0
    j = xp.where(none, rows, j)
    d = xp.take(seeds, j, axis=0) - xp.take(seeds, rows, axis=0)
    offset = 0.5 * (xp.sum(d * d, axis=1) + xp.take(psi, rows) - xp.take(psi, j))
    skip = none | (j == rows) | ~xp.take(active, j) | (count == 0)
    return d, offset, j, skip


@_compat.jit_on_jax()
def _clip_column(xp, seeds, psi, active, cells, rows, j):
    """Clip the cells ``rows`` by the seeds ``j`` (one per row; -1, self or inactive: skip)."""
    d, offset, j, skip = _half_planes(xp, seeds, psi, active, cells.count, rows, j)
    verts, labels, count, over = _compat.blockwise(xp, lambda *a: clip_polygons(xp, *a), cells.vertices,
                                                   cells.labels, cells.count, d, offset, j, skip)
    return Cells(verts, labels, count, cells.overflow | over, cells.certified)


@_compat.jit_on_jax()
def _cut_rows(xp, seeds, psi, active, verts, count, rows, j):
    """Which cells (``verts``, ``count``) of ``rows`` the seeds ``j`` cut (a vertex strictly outside)."""
    d, offset, _, skip = _half_planes(xp, seeds, psi, active, count, rows, j)
    k = xp.arange(verts.shape[1], dtype=xp.int64, device=aac.device(rows))[None, :]
    s = verts[..., 0] * d[:, None, 0] + verts[..., 1] * d[:, None, 1] - offset[:, None]
    return xp.any((s > 0) & (k < count[:, None]), axis=1) & ~skip


def clip_by(xp, seeds, psi, active, cells, rows, candidates):
    """Clip the cells of seeds ``rows`` (m,) by the columns of ``candidates`` (m, K).

    Eagerly each column only clips the cells it cuts (most candidates beyond
    the first few cut nothing).
    """
    if _compat.is_traced(cells.vertices, candidates, psi, seeds):
        return _compat.fori_loop(0, candidates.shape[1], lambda c, x: _clip_column(
            xp, seeds, psi, active, x, rows, _compat.column(candidates, c)), cells)
    cells = _take_rows(xp, cells, xp.arange(rows.shape[0], dtype=xp.int64,
                                            device=aac.device(rows)))      # own copy, written in place
    for c in range(candidates.shape[1]):
        j = candidates[:, c]
        hit = _compat.blockwise(xp, lambda *a: _cut_rows(xp, seeds, psi, active, *a),
                                cells.vertices, cells.count, rows, j)
        size = _compat.capacity(xp, xp.sum(xp.astype(hit, xp.int64)), hit, hit.shape[0])
        if not _compat.host_any(xp, hit):
            continue
        idx, ok = _compat.select(xp, hit, size)
        sub = _clip_column(xp, seeds, psi, active, _take_rows(xp, cells, idx), xp.take(rows, idx),
                           xp.where(ok, xp.take(j, idx), -1))
        cells = cells._replace(**{f: _compat.put_rows(xp, getattr(cells, f), idx, getattr(sub, f))
                                  for f in ("vertices", "labels", "count", "overflow")})
    return cells


@_compat.jit_on_jax()
def area_excess(xp, cells, lo, hi):
    """``(sum of cell areas - box area, tolerance)``: the certificate of exactness."""
    v, count = cells.vertices, cells.count
    n, cap, _ = v.shape
    k = xp.arange(cap, dtype=xp.int64, device=aac.device(v))[None, :]
    cnt = xp.maximum(count, 1)[:, None]
    w = _gather(v, (k + 1) % cnt)
    cross = v[..., 0] * w[..., 1] - v[..., 1] * w[..., 0]
    area = 0.5 * xp.sum(xp.where(k < count[:, None], cross, 0.0))
    box = xp.prod(hi - lo)
    scale = xp.sqrt(xp.sum(xp.where(k < count[:, None], v[..., 0] ** 2 + v[..., 1] ** 2, 0.0)))
    tol = 64.0 * xp.finfo(v.dtype).eps * (box + scale * xp.sqrt(box))
    return area - box, tol


def local_cutters(xp, seeds, psi, active, cells, rows, table):
    """For each vertex of the cells ``rows``, a local seed that cuts it, or -1.

    Vertex ``k`` of cell ``i`` is where the edges shared with cells ``j``
    (incoming) and ``g`` (outgoing) meet; the candidates are the neighbours of
    ``j`` and of ``g``: their rows of ``table`` (n, W).
    """
    incoming, outgoing, valid = _vertex_neighbours(xp, cells)
    return _per_vertex(xp, cells, rows, valid, lambda u, row, idx: _best_cutter(
        xp, seeds, psi, active, u, row, xp.concat([_compat.flat_take(table, xp.take(incoming, idx)),
                                                   _compat.flat_take(table, xp.take(outgoing, idx))], axis=1)))


@_compat.jit_on_jax()
def _vertex_neighbours(xp, cells):
    """Flat ``(m V,)`` neighbours across the incoming and the outgoing edge of each
    vertex (a box side is replaced by the other one), and whether one exists."""
    lab, count = cells.labels, cells.count
    m, cap = lab.shape
    k = xp.arange(cap, dtype=xp.int64, device=aac.device(lab))[None, :]
    cnt = xp.maximum(count, 1)[:, None]
    incoming = _gather(lab, (k - 1 + cnt) % cnt)
    outgoing = xp.where(lab >= 0, lab, incoming)
    incoming = xp.where(incoming >= 0, incoming, outgoing)
    valid = (k < count[:, None]) & (outgoing >= 0)
    flat = [xp.reshape(xp.where(valid, g, 0), (-1,)) for g in (incoming, outgoing)]
    return flat[0], flat[1], xp.reshape(valid, (-1,))


def _per_vertex(xp, cells, rows, valid, find):
    """Run ``find(u, row, idx) -> (P,)`` on the flat vertices ``idx`` where ``valid``
    (all of them under tracing), and return the result as ``(m, V)``, -1 elsewhere."""
    m, cap = cells.labels.shape
    u = xp.reshape(cells.vertices, (m * cap, 2))
    row = xp.reshape(xp.broadcast_to(rows[:, None], (m, cap)), (-1,))
    if _compat.is_traced(u, valid):
        return xp.reshape(xp.where(valid, find(u, row, xp.arange(m * cap, device=aac.device(row))), -1), (m, cap))
    size = _compat.capacity(xp, xp.sum(xp.astype(valid, xp.int64)), valid, m * cap)
    idx, ok = _compat.select(xp, valid, size)
    found = xp.where(ok, _compat.blockwise(xp, find, xp.take(u, idx, axis=0), xp.take(row, idx), idx), -1)
    full = -xp.ones((m * cap,), dtype=xp.int64, device=aac.device(row))
    return xp.reshape(_compat.set_rows(xp, full, idx, found), (m, cap))


@_compat.jit_on_jax()
def _best_cutter(xp, seeds, psi, active, u, row, cand):
    """Per vertex ``u`` (P, 2) of the cell of seed ``row`` (P,), the candidate of
    ``cand`` (P, C) (-1: none) of least power if it is below the cell's own, else -1.

    With ``v = y_row + u`` and the planes ``f_j(v) = v . y_j + (psi_j - |y_j|^2) / 2``,
    ``power_row(v) - power_j(v) = 2 (f_j(v) - f_row(v))``: one gather of
    ``(y_j, h_j)`` per candidate.
    """
    h = xp.where(active, 0.5 * (psi - xp.sum(seeds * seeds, axis=1)), -xp.inf)
    planes = xp.concat([seeds, h[:, None]], axis=1)                     # (n, 3)
    ok = (cand >= 0) & (cand != row[:, None])
    c = _compat.flat_take(planes, xp.where(ok, cand, 0))               # (P, C, 3)
    own = xp.take(planes, row, axis=0)
    v = u + own[:, :2]
    f_own = v[:, 0] * own[:, 0] + v[:, 1] * own[:, 1] + own[:, 2]
    s = v[:, None, 0] * c[..., 0] + v[:, None, 1] * c[..., 1] + c[..., 2] - f_own[:, None]
    scale = xp.max(xp.abs(planes[:, :2])) * (xp.abs(v[:, 0]) + xp.abs(v[:, 1])) + xp.abs(f_own)
    s = xp.where(ok, s, -xp.inf) - (64.0 * xp.finfo(u.dtype).eps * scale)[:, None]
    best = xp.argmax(s, axis=1)
    found = xp.max(s, axis=1) > 0
    return xp.where(found, xp.take_along_axis(cand, best[:, None], axis=1)[:, 0], -1)


def exact_cutters(xp, seeds, psi, active, cells, rows):
    """For every vertex of the cells ``rows``, the seed of least power there if it
    cuts the vertex off, else -1 (a nearest-neighbour query among lifted seeds)."""
    m, cap = cells.labels.shape
    k = xp.arange(cap, dtype=xp.int64, device=aac.device(rows))[None, :]
    valid = xp.reshape(k < cells.count[:, None], (-1,))
    points = lifted(xp, seeds, psi, active)

    def find(u, row, idx):
        q = u + xp.take(seeds, row, axis=0)
        q = xp.concat([q, xp.zeros((q.shape[0], 1), dtype=q.dtype, device=aac.device(q))], axis=1)
        return _best_cutter(xp, seeds, psi, active, u, row, _compat.nearest(xp, points, q)[:, None])
    return _per_vertex(xp, cells, rows, valid, find)


@_compat.jit_on_jax()
def lifted(xp, seeds, psi, active):
    """Lifted points ``(y_i, sqrt(M - psi_i))``; inactive seeds are lifted far away."""
    big = xp.max(xp.where(active, psi, -xp.inf))
    span = xp.max(seeds, axis=0) - xp.min(seeds, axis=0)
    far = big - 4.0 * xp.sum(span * span) - 1.0
    psi_eff = xp.where(active, psi, far)
    h = xp.sqrt(xp.maximum(big - psi_eff, 0.0))
    return xp.concat([seeds, h[:, None]], axis=1)


# ------------------------------------------------------------------- driver
def first_candidates(xp, seeds, k: int = FIRST_CANDIDATES):
    """Candidates of a first diagram, ``(n, K)``, -1 padding: the Delaunay neighbours
    (the exact Voronoi neighbours: one clip per candidate, nothing to repair at
    zero weights); without a host, the ``k`` nearest seeds and the seed itself."""
    found = _compat.delaunay_neighbours(xp, seeds, k + 4)
    if found is not None:
        return found
    n = seeds.shape[0]
    found = _compat.knn(xp, seeds, min(k + 1, n))
    if found.shape[1] >= k + 1:
        return found
    pad = -xp.ones((n, k + 1 - found.shape[1]), dtype=found.dtype, device=aac.device(found))
    return xp.concat([found, pad], axis=1)


@_compat.jit_on_jax("width")
def neighbours(xp, cells, width: int):
    """Each cell's neighbours (its edge labels >= 0) first, ``width`` columns, -1 after.

    The candidates of the next diagram, and the table of the local test; a hint
    only: a neighbour cut off by ``width`` is found by the repair.
    """
    lab = cells.labels
    k = xp.arange(lab.shape[1], dtype=xp.int64, device=aac.device(lab))[None, :]
    lab = xp.where((k < cells.count[:, None]) & (lab >= 0), lab, -1)
    order = xp.argsort(xp.astype(lab < 0, xp.int8), axis=1, stable=True)[:, :width]
    return xp.take_along_axis(lab, order, axis=1)


def max_degree(xp, cells):
    """Largest number of neighbours of a cell (eager sizing of the candidates)."""
    lab = cells.labels
    k = xp.arange(lab.shape[1], dtype=xp.int64, device=aac.device(lab))[None, :]
    edges = (k < cells.count[:, None]) & (lab >= 0)
    return _compat.to_int(xp.max(xp.sum(xp.astype(edges, xp.int64), axis=1)))


def power_cells(xp, seeds, psi, active, lo, hi, candidates=None, capacity: int = CAPACITY,
                rounds: int = ROUNDS, previous=None):
    """Cells of every seed, exact up to rounding (see the module docstring).

    ``previous``: cells of the same seeds at other weights (the last Newton
    step): their combinatorics give the new vertices directly (:func:`update`).
    Otherwise every cell is the box clipped by its ``candidates`` (n, K) (valid
    ones, >= 0, first in each row; default the nearest seeds). Eagerly an
    overflowing vertex capacity is doubled and everything rebuilt; under
    tracing the flags report it.
    """
    n = seeds.shape[0]
    dev = aac.device(seeds)
    rows = xp.arange(n, dtype=xp.int64, device=dev)
    if previous is not None and previous.labels.shape[1] == capacity:
        cells, dirty = update(xp, seeds, psi, active, lo, hi, previous)
    else:
        if candidates is None:
            candidates = (first_candidates(xp, seeds) if previous is None
                          else neighbours(xp, previous, min(capacity, previous.labels.shape[1])))
        cells = clip_by(xp, seeds, psi, active, box_cells(xp, seeds, lo, hi, active, capacity), rows, candidates)
        dirty = xp.ones((n,), dtype=xp.bool, device=dev)
    cells = repair(xp, seeds, psi, active, lo, hi, cells, dirty, rounds)
    if capacity >= 1024 or not _compat.host_any(xp, cells.overflow):
        return cells
    return power_cells(xp, seeds, psi, active, lo, hi, candidates, 2 * capacity, rounds, previous)


# ------------------------------------------------------------------ updates
@_compat.jit_on_jax()
def _lines(xp, seeds, psi, lo, hi, labels):
    """Line of the edge of every slot: ``u . normal = offset`` (relative to the seed),
    ``normal`` outward; a neighbour's bisector or a side of the box."""
    n, cap = labels.shape
    j = xp.where(labels >= 0, labels, 0)
    d = _compat.flat_take(seeds, j) - seeds[:, None, :]
    offset = 0.5 * (xp.sum(d * d, axis=-1) + psi[:, None] - xp.reshape(xp.take(psi, xp.reshape(j, (-1,))), (n, cap)))
    side = -1 - labels                                   # 0: y = lo, 1: x = hi, 2: y = hi, 3: x = lo
    zero, one = xp.zeros_like(offset), xp.ones_like(offset)
    sx = xp.where(side == 1, one, xp.where(side == 3, -one, zero))
    sy = xp.where(side == 2, one, xp.where(side == 0, -one, zero))
    lo_rel, hi_rel = lo[None, :] - seeds, hi[None, :] - seeds    # (n, 2)
    side_offset = xp.where(side == 0, -lo_rel[:, 1:2], xp.where(side == 1, hi_rel[:, 0:1], xp.where(
        side == 2, hi_rel[:, 1:2], -lo_rel[:, 0:1])))
    is_seed = labels >= 0
    normal = xp.stack([xp.where(is_seed, d[..., 0], sx), xp.where(is_seed, d[..., 1], sy)], axis=-1)
    return normal, xp.where(is_seed, offset, side_offset)


@_compat.jit_on_jax()
def _updated(xp, seeds, psi, active, lo, hi, previous):
    """Vertices from the combinatorics of ``previous``, and which cells stay valid.

    Vertex k meets the lines of edges k - 1 and k. A cell stays valid when
    consecutive lines turn left, every edge keeps a non-negative length along
    its line and every vertex stays in the box: then it is the intersection of
    the half-planes of its edges (a superset of the true cell, which is all the
    area certificate needs). A flip (an edge vanishing here, appearing next
    door) shows as a reversed edge in the cells that lose it; the cells that
    gain one are among their neighbours.
    """
    labels, count = previous.labels, previous.count
    n, cap = labels.shape
    k = xp.arange(cap, dtype=xp.int64, device=aac.device(labels))[None, :]
    cnt = xp.maximum(count, 1)[:, None]
    valid = k < count[:, None]
    normal, offset = _lines(xp, seeds, psi, lo, hi, labels)
    prev = (k - 1 + cnt) % cnt
    n_a, o_a = _gather(normal, prev), _gather(offset, prev)
    det = n_a[..., 0] * normal[..., 1] - n_a[..., 1] * normal[..., 0]
    safe = xp.where(det > 0, det, 1.0)
    vx = (o_a * normal[..., 1] - offset * n_a[..., 1]) / safe
    vy = (n_a[..., 0] * offset - normal[..., 0] * o_a) / safe
    verts = xp.where(valid[..., None], xp.stack([vx, vy], axis=-1), previous.vertices)
    scale = xp.max(xp.where(valid, xp.abs(vx) + xp.abs(vy), 0.0), axis=1, keepdims=True)
    tol = 64.0 * xp.finfo(verts.dtype).eps * (scale + 1.0) * (scale + 1.0)
    nxt = _gather(verts, (k + 1) % cnt)
    along = (nxt[..., 0] - vx) * -normal[..., 1] + (nxt[..., 1] - vy) * normal[..., 0]
    lo_rel, hi_rel = (lo[None, :] - seeds)[:, None, :], (hi[None, :] - seeds)[:, None, :]
    inside = xp.all((verts >= lo_rel - tol[..., None]) & (verts <= hi_rel + tol[..., None]), axis=-1)
    good = (det > 0) & (along >= -tol) & inside
    ok = xp.all(good | ~valid, axis=1) & ((count >= 3) | ~active)
    flipped = valid & (labels >= 0) & (along < -tol)
    return previous._replace(vertices=verts, certified=xp.asarray(False, device=aac.device(labels))), ok, flipped


def flip_partners(xp, labels, count, flipped, width: int):
    """Seeds each cell gains by edge flips, ``(n, width)`` (-1 padding, duplicates dropped).

    When edge ``k`` of a cell (its neighbour ``j``) vanishes, its ends lie on
    the edges of ``p`` (slot ``k - 1``) and ``q`` (slot ``k + 1``): the flip
    of the dual edge ``ij`` creates the edge ``pq``, so ``p`` gains ``q`` and
    ``q`` gains ``p``. Eagerly only the flipped slots are sorted.
    """
    gainer, gained = _flip_pairs(xp, labels, count, flipped)
    if not _compat.is_traced(gainer):
        ok = gainer < labels.shape[0]
        size = _compat.capacity(xp, xp.sum(xp.astype(ok, xp.int64)), ok, ok.shape[0])
        idx, _ = _compat.select(xp, ok, max(size, 1))
        gainer, gained = xp.take(gainer, idx), xp.take(gained, idx)
    return _pack_pairs(xp, gainer, gained, labels[:, 0], width)


@_compat.jit_on_jax()
def _flip_pairs(xp, labels, count, flipped):
    """Flat ``(gainer, gained)`` of every slot, twice; gainer ``n`` where no flip."""
    n, cap = labels.shape
    k = xp.arange(cap, dtype=xp.int64, device=aac.device(labels))[None, :]
    cnt = xp.maximum(count, 1)[:, None]
    p, q = _gather(labels, (k - 1 + cnt) % cnt), _gather(labels, (k + 1) % cnt)
    ok = flipped & (p >= 0) & (q >= 0) & (p != q)
    ok = xp.reshape(xp.concat([ok, ok], axis=1), (-1,))
    gainer = xp.where(ok, xp.reshape(xp.concat([p, q], axis=1), (-1,)), n)
    gained = xp.where(ok, xp.reshape(xp.concat([q, p], axis=1), (-1,)), 0)
    return gainer, gained


@_compat.jit_on_jax("width")
def _pack_pairs(xp, gainer, gained, like, width: int):
    """Table ``(n, width)`` of the distinct ``gained`` of each ``gainer`` (``n = like.shape[0]``)."""
    n, dev = like.shape[0], aac.device(like)
    key = gainer * (n + 1) + gained
    order = xp.argsort(key, stable=True)
    key, gainer, gained = xp.take(key, order), xp.take(gainer, order), xp.take(gained, order)
    m = key.shape[0]
    first = xp.concat([xp.ones((1,), dtype=xp.bool, device=dev), key[1:] != key[:-1]])
    distinct = xp.cumulative_sum(xp.astype(first, xp.int64))
    rank = distinct - xp.take(distinct, xp.searchsorted(gainer, gainer))   # among the gainer's pairs
    keep = first & (gainer < n) & (rank < width)
    slot = xp.where(keep, gainer * width + rank, n * width + xp.arange(m, dtype=xp.int64, device=dev))
    out = -xp.ones((n * width + m,), dtype=xp.int64, device=dev)
    out = _compat.set_rows(xp, out, slot, xp.where(keep, gained, -1))
    return xp.reshape(out[:n * width], (n, width))


def update(xp, seeds, psi, active, lo, hi, previous):
    """Cells at weights ``psi`` from those of ``previous``; returns ``(cells, dirty)``.

    Valid cells keep their combinatorics (:func:`_updated`); the invalid ones
    are clipped again by their previous neighbours (in blocks of
    :func:`_budget` rows). They and their neighbours (which may gain an edge
    from a flip) are the first cells the repair tests.
    """
    n = seeds.shape[0]
    cells, ok, flipped = _updated(xp, seeds, psi, active, lo, hi, previous)
    table = _table(xp, previous)
    cap = previous.labels.shape[1]

    def reclip(cells, mask, table, from_box):
        def body(state):
            cells, left = state
            rows, valid = _compat.select(xp, left, _budget(xp, left))
            start = _take_rows(xp, cells, rows)
            if from_box:
                start = box_cells(xp, xp.take(seeds, rows, axis=0), lo, hi, xp.take(active, rows) & valid, cap)
            redone = clip_by(xp, seeds, psi, active, start, rows,
                             xp.where(valid[:, None], xp.take(table, rows, axis=0), -1))
            redone = _keep_rows(xp, valid, redone, _take_rows(xp, cells, rows))
            return _put_rows(xp, cells, rows, redone), left & ~_mask(xp, rows, valid, n)
        return _compat.while_loop(lambda state: _any(xp, state[1]), body, (cells, mask))[0]

    cells = reclip(cells, ~ok, table, True)
    gained = flip_partners(xp, previous.labels, previous.count, flipped, FLIP_WIDTH)
    cells = reclip(cells, xp.any(gained >= 0, axis=1), gained, False)
    return cells, _around(xp, previous, ~ok)


@_compat.jit_on_jax()
def _keep_rows(xp, valid, new, old):
    """``new`` cells where ``valid``, ``old`` elsewhere."""
    return new._replace(vertices=xp.where(valid[:, None, None], new.vertices, old.vertices),
                        labels=xp.where(valid[:, None], new.labels, old.labels),
                        count=xp.where(valid, new.count, old.count),
                        overflow=xp.where(valid, new.overflow, old.overflow))


@_compat.jit_on_jax()
def _around(xp, cells, mask):
    """``mask`` and the neighbours of the cells in ``mask``."""
    n, cap = cells.labels.shape
    k = xp.arange(cap, dtype=xp.int64, device=aac.device(mask))[None, :]
    lab = xp.where((k < cells.count[:, None]) & (cells.labels >= 0) & mask[:, None], cells.labels, -1)
    return mask | _hits(xp, xp.reshape(lab, (-1,)), n)


def _hits(xp, idx, n):
    """Boolean mask (n,) of the entries ``idx`` (-1 ignored)."""
    ok = idx >= 0
    return _compat.segment_sum(xp, xp.astype(ok, xp.int64), xp.where(ok, idx, 0), n) > 0


def _mask(xp, rows, valid, n):
    """Boolean mask (n,) of the ``rows`` where ``valid``."""
    return _hits(xp, xp.where(valid, rows, -1), n)


def _budget(xp, mask):
    """Rows processed at once: all of ``mask`` eagerly; a fixed share of the cells traced."""
    n = mask.shape[0]
    if _compat.is_traced(mask):
        return min(n, max(64, n // 8))
    return _compat.capacity(xp, xp.sum(xp.astype(mask, xp.int64)), mask, n)


# ------------------------------------------------------------------- repair
def _table(xp, cells, width=None):
    """Neighbour table: every neighbour eagerly (at most ``width``), ``FIRST_CANDIDATES`` traced."""
    if _compat.is_traced(cells.labels):
        return neighbours(xp, cells, min(cells.labels.shape[1], FIRST_CANDIDATES))
    degree = max(max_degree(xp, cells), 1)
    return neighbours(xp, cells, degree if width is None else min(degree, width))


@_compat.jit_on_jax()
def _any(xp, mask):
    return xp.any(mask)


class _RepairState(NamedTuple):
    cells: object
    dirty: object       # (n,) cells to test next
    mode: object        # () 0: dirty cells, 1: a sweep of every cell, 2: an exact sweep
    rounds: object      # () rounds done


def repair(xp, seeds, psi, active, lo, hi, cells, dirty, rounds: int = ROUNDS):
    """Clip cells by their cutters until the area certificate holds.

    Each round tests dirty cells (eagerly all of them, traced a block of
    :func:`_budget` rows) for local cutters, clips them, and marks dirty what
    changed: those cells, their cutters and their neighbours. When no dirty
    cell is left without the certificate holding, every cell is tested (mode
    1), then every vertex exactly (mode 2); an exact sweep without cutters
    certifies the cells up to rounding.
    """
    n = seeds.shape[0]
    dev = aac.device(seeds)
    done = xp.asarray(True, device=dev)

    def cond(state):
        return ~state.cells.certified & (state.rounds < rounds)

    def work(state):
        cells, dirty, mode, _ = state
        rows, valid = _compat.select(xp, dirty, _budget(xp, dirty))
        sub = _take_rows(xp, cells, rows)
        cut = _compat.cond(mode == 2, lambda: exact_cutters(xp, seeds, psi, active, sub, rows),
                           lambda: local_cutters(xp, seeds, psi, active, sub, rows, _table(xp, cells, TABLE_WIDTH)))
        cut = xp.where(valid[:, None], cut, -1)
        left = dirty & ~_mask(xp, rows, valid, n)
        found = _any(xp, cut >= 0)
        cells = _compat.cond(found, lambda: _clip_rows(xp, seeds, psi, active, cells, rows, cut), lambda: cells)
        touched = _around(xp, cells, _mask(xp, rows, xp.any(cut >= 0, axis=1), n)) | _hits(
            xp, xp.reshape(cut, (-1,)), n)
        exhausted = ~found & ~_any(xp, left)             # this mode found nothing anywhere
        dirty = xp.where(exhausted, xp.ones_like(dirty), left | touched)
        mode = xp.where(found, 0, xp.where(exhausted, mode + 1, mode))
        return cells._replace(certified=exhausted & (mode > 2)), dirty, mode

    def body(state):
        excess, tol = area_excess(xp, state.cells, lo, hi)
        cells, dirty, mode = _compat.cond(
            excess > tol, lambda: work(state),
            lambda: (state.cells._replace(certified=done), state.dirty, state.mode))
        return _RepairState(cells, dirty, mode, state.rounds + 1)

    zero = xp.asarray(0, dtype=xp.int64, device=dev)
    state = _RepairState(cells._replace(certified=~done), dirty, zero, zero)
    return _compat.while_loop(cond, body, state).cells


def _clip_rows(xp, seeds, psi, active, cells, rows, cut):
    """``cells`` with the cells ``rows`` clipped by their cutters ``cut`` (m, V)."""
    width = 4 if _compat.is_traced(cut) else max(
        _compat.to_int(xp.max(xp.sum(xp.astype(cut >= 0, xp.int64), axis=1))), 1)
    sub = clip_by(xp, seeds, psi, active, _take_rows(xp, cells, rows), rows, _first_columns(xp, cut, width))
    return _put_rows(xp, cells, rows, sub)


@_compat.jit_on_jax("width")
def _first_columns(xp, cut, width: int):
    """The non-negative entries of each row of ``cut`` first, ``width`` columns."""
    order = xp.argsort(xp.astype(cut < 0, xp.int8), axis=1, stable=True)[:, :width]
    return xp.take_along_axis(cut, order, axis=1)


@_compat.jit_on_jax("size")
def _pick_rows(xp, rows, cutters, has, size: int):
    """The ``size`` first rows with a cutter (padding rows get no cutter)."""
    keep, valid = _compat.select(xp, has, size)
    return xp.take(rows, keep), xp.where(valid[:, None], xp.take(cutters, keep, axis=0), -1)


@_compat.jit_on_jax()
def _take_rows(xp, cells, rows):
    return cells._replace(**{f: _compat.flat_take(getattr(cells, f), rows)
                             for f in ("vertices", "labels", "count", "overflow")})


@_compat.jit_on_jax()
def _put_rows(xp, cells, rows, sub):
    return cells._replace(**{f: _compat.set_rows(xp, getattr(cells, f), rows, getattr(sub, f))
                             for f in ("vertices", "labels", "count", "overflow")})
