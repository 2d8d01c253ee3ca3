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

#: Nearest seeds used as candidates for a diagram without a previous one.
FIRST_CANDIDATES = 12
#: Vertex capacity per cell (doubled eagerly on overflow).
CAPACITY = 16
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
    verts, labels, count, over = clip_polygons(xp, cells.vertices, cells.labels, cells.count,
                                               d, offset, j, skip)
    return Cells(verts, labels, count, cells.overflow | over, cells.certified)


@_compat.jit_on_jax()
def _cut_rows(xp, seeds, psi, active, cells, rows, j):
    """Which cells ``rows`` the seeds ``j`` cut (a vertex strictly outside)."""
    d, offset, _, skip = _half_planes(xp, seeds, psi, active, cells.count, rows, j)
    k = xp.arange(cells.labels.shape[1], dtype=xp.int64, device=aac.device(rows))[None, :]
    s = xp.sum(cells.vertices * d[:, None, :], axis=-1) - offset[:, None]
    return xp.any((s > 0) & (k < cells.count[:, None]), axis=1) & ~skip


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
        hit = _cut_rows(xp, seeds, psi, active, cells, rows, j)
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

    At vertex ``k`` of cell ``i`` the outgoing edge borders cell ``g`` (the
    incoming one if the outgoing edge is a side of the box); the candidates
    are the neighbours of ``g``: row ``g`` of ``table`` (n, W).
    """
    g, valid = _vertex_neighbour(xp, cells)
    return _per_vertex(xp, cells, rows, valid, lambda u, row, idx: _best_cutter(
        xp, seeds, psi, active, u, row, _compat.flat_take(table, xp.take(g, idx))))


@_compat.jit_on_jax()
def _vertex_neighbour(xp, cells):
    """Flat ``(m V,)`` neighbour across the outgoing edge of each vertex (or the
    incoming one on a box side), and whether it exists."""
    lab, count = cells.labels, cells.count
    m, cap = lab.shape
    k = xp.arange(cap, dtype=xp.int64, device=aac.device(lab))[None, :]
    cnt = xp.maximum(count, 1)[:, None]
    incoming = _gather(lab, (k - 1 + cnt) % cnt)
    g = xp.where(lab >= 0, lab, incoming)
    valid = (k < count[:, None]) & (g >= 0)
    return xp.reshape(xp.where(valid, g, 0), (-1,)), xp.reshape(valid, (-1,))


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
    found = xp.where(ok, find(xp.take(u, idx, axis=0), xp.take(row, idx), idx), -1)
    full = -xp.ones((m * cap,), dtype=xp.int64, device=aac.device(row))
    return xp.reshape(_compat.set_rows(xp, full, idx, found), (m, cap))


@_compat.jit_on_jax()
def _best_cutter(xp, seeds, psi, active, u, row, cand):
    """Per vertex ``u`` (P, 2) of the cell of seed ``row`` (P,), the candidate of
    ``cand`` (P, C) (-1: none) of least power if it is below the cell's own, else -1."""
    ok = cand >= 0
    cand = xp.where(ok, cand, 0)
    d = _compat.flat_take(seeds, cand) - xp.take(seeds, row, axis=0)[:, None, :]   # (P, C, 2)
    own_psi = xp.take(psi, row)[:, None]
    other_psi = xp.reshape(xp.take(psi, xp.reshape(cand, (-1,))), tuple(cand.shape))
    dd = d[..., 0] * d[..., 0] + d[..., 1] * d[..., 1]
    s = u[:, None, 0] * d[..., 0] + u[:, None, 1] * d[..., 1] - 0.5 * (dd + own_psi - other_psi)
    norm_u = xp.sqrt(u[:, 0] * u[:, 0] + u[:, 1] * u[:, 1])[:, None]
    tol = 64.0 * xp.finfo(u.dtype).eps * (norm_u * xp.sqrt(dd) + dd + xp.abs(own_psi - other_psi))
    act = xp.reshape(xp.take(active, xp.reshape(cand, (-1,))), tuple(cand.shape))
    s = xp.where(ok & act & (cand != row[:, None]), s - tol, 0.0)
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
    """The ``k`` nearest seeds of every seed and itself, ``(n, k + 1)`` (-1 padding
    where ``n <= k``)."""
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
                rounds: int = ROUNDS):
    """Cells of every seed, exact up to rounding (see the module docstring).

    ``candidates`` (n, K): seeds to clip each cell by first, valid ones (>= 0)
    first in each row; default the nearest seeds. Eagerly an overflowing vertex
    capacity is doubled and everything rebuilt; under tracing the flags report it.
    """
    n = seeds.shape[0]
    if candidates is None:
        candidates = first_candidates(xp, seeds)
    rows = xp.arange(n, dtype=xp.int64, device=aac.device(seeds))
    while True:
        cells = box_cells(xp, seeds, lo, hi, active, capacity)
        cells = clip_by(xp, seeds, psi, active, cells, rows, candidates)
        cells = repair(xp, seeds, psi, active, lo, hi, cells, rounds)
        if capacity >= 1024 or not _compat.host_any(xp, cells.overflow):
            return cells
        capacity *= 2


def _table(xp, cells):
    """Neighbour table of the local test: every neighbour eagerly, a fixed width traced."""
    if _compat.is_traced(cells.labels):
        return neighbours(xp, cells, min(cells.labels.shape[1], FIRST_CANDIDATES))
    return neighbours(xp, cells, max(max_degree(xp, cells), 1))


def _cutters(xp, seeds, psi, active, cells, sub, rows):
    """Cutters of the cells ``sub`` (those of seeds ``rows``): local ones, or, if
    there are none, the exact ones."""
    local = local_cutters(xp, seeds, psi, active, sub, rows, _table(xp, cells))
    return _compat.cond(
        _any(xp, local >= 0), lambda: local,
        lambda: exact_cutters(xp, seeds, psi, active, sub, rows))


@_compat.jit_on_jax()
def _any(xp, mask):
    return xp.any(mask)


def repair(xp, seeds, psi, active, lo, hi, cells, rounds: int = ROUNDS):
    """Clip cells by their cutters until the area certificate holds (or no vertex
    is cut off at all, which certifies the cells up to rounding).

    Eagerly, after the first round only the cells clipped in the previous round
    and their cutters are searched for local cutters (all of them if that finds none).
    """
    n = seeds.shape[0]
    dev = aac.device(seeds)
    all_rows = xp.arange(n, dtype=xp.int64, device=dev)
    if _compat.is_traced(cells.vertices, psi, seeds):
        def cond(state):
            cells, r = state
            return ~cells.certified & (r < rounds)

        def body(state):
            cells, r = state
            excess, tol = area_excess(xp, cells, lo, hi)
            cut = _compat.cond(excess > tol,
                               lambda: _cutters(xp, seeds, psi, active, cells, cells, all_rows),
                               lambda: -xp.ones(cells.labels.shape, dtype=xp.int64, device=dev))
            done = (excess <= tol) | ~_any(xp, cut >= 0)
            new = clip_by(xp, seeds, psi, active, cells, all_rows, _first_columns(xp, cut, 4))
            new = _compat.tree_where(xp, done, cells, new)
            return new._replace(certified=done), r + 1
        r0 = xp.asarray(0, dtype=xp.int64, device=dev)
        return _compat.while_loop(cond, body, (cells, r0))[0]
    dirty = None                                   # None: every cell
    for _ in range(rounds):
        excess, tol = area_excess(xp, cells, lo, hi)
        if not _compat.host_any(xp, excess > tol):
            break
        cut = None if dirty is None else _cutters_of(xp, seeds, psi, active, cells, dirty)
        if cut is None:
            cut = _cutters(xp, seeds, psi, active, cells, cells, all_rows)
        has = xp.any(cut >= 0, axis=1)
        if not _compat.host_any(xp, has):
            break
        size = _compat.capacity(xp, xp.sum(xp.astype(has, xp.int64)), has, n)
        rows, cut = _pick_rows(xp, all_rows, cut, has, size)
        width = _compat.to_int(xp.max(xp.sum(xp.astype(cut >= 0, xp.int64), axis=1)))
        sub = clip_by(xp, seeds, psi, active, _take_rows(xp, cells, rows), rows,
                      _first_columns(xp, cut, width))
        cells = _put_rows(xp, cells, rows, sub)
        k = xp.arange(sub.labels.shape[1], dtype=xp.int64, device=dev)[None, :]
        around = xp.where(k < sub.count[:, None], sub.labels, -1)       # their neighbours' tables changed
        touched = xp.concat([rows, xp.reshape(cut, (-1,)), xp.reshape(around, (-1,))])
        hit = xp.astype(touched >= 0, xp.int64)
        dirty = _compat.segment_sum(xp, hit, xp.where(touched >= 0, touched, 0), n) > 0
    else:
        return cells
    return cells._replace(certified=xp.asarray(True, device=dev))


def _cutters_of(xp, seeds, psi, active, cells, mask):
    """Local cutters ``(n, V)`` of the cells in ``mask`` only, or None if they have none."""
    n = seeds.shape[0]
    size = _compat.capacity(xp, xp.sum(xp.astype(mask, xp.int64)), mask, n)
    rows, valid = _compat.select(xp, mask, size)
    local = local_cutters(xp, seeds, psi, active, _take_rows(xp, cells, rows), rows, _table(xp, cells))
    local = xp.where(valid[:, None], local, -1)
    if not _compat.host_any(xp, local >= 0):
        return None
    full = -xp.ones(cells.labels.shape, dtype=xp.int64, device=aac.device(rows))
    return _compat.set_rows(xp, full, rows, local)


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
