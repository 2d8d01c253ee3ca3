"""Repair of clipped cells until the area certificate holds (see :mod:`.diagram`).

Each vertex of cell i, where the edges of neighbours j and g meet, is tested
against the neighbours of j and g (the local regularity test of the dual
triangle ijg); a seed of lower power there cuts the cell. If no such local
cutter exists, every cell is tested, then every vertex exactly: against the
cell's neighbours in the regular triangulation (eagerly, Qhull on the host), or
the seed of least power at ``v``, the nearest lifted seed
``(y_j, sqrt(M - psi_j))`` to ``(v, 0)``, ``M = max psi``.
"""
from __future__ import annotations

from typing import NamedTuple

import array_api_compat as aac

from .. import _compat, row_blocks, seed_neighbours

from .agreement import unmatched
from ..options import DIAGRAM
from .polygons import area_excess, clip_by, max_degree, neighbours
from . import polygons as pg


class _RepairState(NamedTuple):
    cells: object
    dirty: object       # (n,) cells to test next
    mode: object        # () 0: dirty cells, 1: a sweep of every cell, 2: an exact sweep
    rounds: object      # () rounds done
    held: object        # () the certificate held (clipping by cutters keeps it)


def repair(xp, seeds, psi, active, lo, hi, cells, dirty, options=DIAGRAM):
    """Clip cells by their cutters until the area certificate holds, in at most
    ``options.repair_rounds`` rounds (``options``: a :class:`..options.DiagramOptions`).

    ``cells`` must be the solver's own: eagerly they are written in place.
    Each round tests dirty cells (eagerly all of them, traced a block of
    :func:`.polygons.budget` rows) for local cutters, clips them, and marks dirty what
    changed: those cells, their cutters and their neighbours, until none is
    left, in FP32 even once the certificate holds: its rounding tolerance can
    hide a sliver of a cell there (measured: 3% of a cell, 4e-5 of the area, at
    300 seeds); then the certificate is not computed again, since clipping by true
    cutters keeps it. When no dirty cell is left without the certificate holding, every
    cell is tested (mode 1), then every vertex exactly (mode 2); an exact sweep
    without cutters certifies the cells up to rounding. From round
    ``options.local_rounds`` on, every round tests its cells' vertices exactly: a local
    cutter is found one neighbour a round, and cells far from their true neighbours (Diracs
    on the sides of the square) would take as many rounds as seeds along a side.
    """
    n = seeds.shape[0]
    dev = aac.device(seeds)
    done = xp.asarray(True, device=dev)

    # the certificate's rounding tolerance hides a sliver of at most ~1e-13 of the box in
    # FP64, below anything the solver resolves: there, no drain once it holds
    drain = xp.finfo(cells.vertices.dtype).eps > 1e-10

    def pending(state):
        return (state.mode == 0) & pg.any_true(xp, state.dirty) & drain

    def cond(state):
        return (~state.cells.certified | pending(state)) & (state.rounds < options.repair_rounds)

    def work(state, holds):
        cells, dirty, mode = state.cells, state.dirty, state.mode
        rows, valid = _compat.select(xp, dirty, max(pg.budget(xp, dirty), min(n, 1)))   # none: padding
        exact = (mode == 2) | (state.rounds >= options.local_rounds)
        cut = _compat.cond(exact, lambda: exact_cutters(xp, seeds, psi, active, cells, rows),
                           lambda: local_cutters(xp, seeds, psi, active, cells, rows,
                                                 table(xp, cells, options.table_width, rows,
                                                       options.table_traced)))
        cut = xp.where(valid[:, None], cut, -1)
        left = dirty & ~pg.mask_of(xp, rows, valid, n)
        found = pg.any_true(xp, cut >= 0)
        cells = _compat.cond(found, lambda: _clip_rows(xp, seeds, psi, active, cells, rows, cut), lambda: cells)
        touched = unmatched(xp, cells, pg.around(xp, cells, pg.mask_of(xp, rows, xp.any(cut >= 0, axis=1), n))
                            | pg.hits(xp, xp.reshape(cut, (-1,)), n), rows.shape[0], options.agreement_from)
        exhausted = ~found & ~pg.any_true(xp, left)             # this mode found nothing anywhere
        dirty = xp.where(exhausted, xp.ones_like(dirty), left | touched)
        mode = xp.where(found, 0, xp.where(exhausted, mode + 1, mode))
        return cells._replace(certified=(holds & ~found) | (exhausted & (mode > 2))), dirty, mode

    def certificate(cells):
        excess, tol = area_excess(xp, cells, lo, hi)
        return excess <= tol

    def body(state):
        # the certificate first (it may hold already), then once no dirty cell is left
        busy = (state.rounds > 0) & (state.mode == 0) & pg.any_true(xp, state.dirty)
        holds = _compat.cond(state.held | busy, lambda: state.held, lambda: certificate(state.cells))
        cells, dirty, mode = _compat.cond(
            ~holds | pending(state), lambda: work(state, holds),
            lambda: (state.cells._replace(certified=done), state.dirty, state.mode))
        return _RepairState(cells, dirty, mode, state.rounds + 1, holds)

    zero = xp.asarray(0, dtype=xp.int64, device=dev)
    state = _RepairState(cells._replace(certified=~done), dirty, zero, zero, ~done)
    return _compat.while_loop(cond, body, state).cells


def table(xp, cells, width=None, rows=None, traced_width: int = DIAGRAM.table_traced):
    """Neighbour table: every neighbour eagerly (at most ``width``), ``traced_width`` traced.
    Eagerly with ``rows``, only the rows of their neighbours (the others -1) if they are few."""
    if _compat.static_shapes(cells.labels):
        return neighbours(xp, cells, min(cells.labels.shape[1], traced_width))
    n = cells.count.shape[0]
    if rows is None or 8 * rows.shape[0] > n:
        return neighbours(xp, cells, _width(xp, cells, width))
    near, needed, _ = pg.neighbour_cells(xp, cells, xp.take(cells.labels, rows, axis=0), xp.take(cells.count, rows))
    width = _width(xp, near, width)                 # the degrees of the rows read only
    out = -xp.ones((n, width), dtype=xp.int64, device=aac.device(rows))
    return _compat.put_rows(xp, out, needed, neighbours(xp, near, width))


def _width(xp, cells, width):
    """Columns of a table of every neighbour of ``cells``, at most ``width``."""
    degree = max(max_degree(xp, cells), 1)
    return degree if width is None else min(degree, width)


def local_cutters(xp, seeds, psi, active, cells, rows, table):
    """For each vertex of the cells ``rows`` (m,), a local seed that cuts it, or -1: (m, V).

    Vertex ``k`` of cell ``i`` is where the edges shared with cells ``j``
    (incoming) and ``g`` (outgoing) meet; the candidates are the neighbours of
    ``j`` and of ``g``: their rows of ``table`` (n, W).
    """
    planes = _planes(xp, seeds, psi, active)

    def block(rows):
        sub = pg.take_rows(xp, cells, rows)
        incoming, outgoing, valid = _vertex_neighbours(xp, sub.labels, sub.count)
        return _per_vertex(xp, sub, rows, valid, lambda u, row, idx: _best_cutter(
            xp, *planes, u, row, xp.reshape(_compat.flat_take(table, xp.stack(
                [xp.take(incoming, idx), xp.take(outgoing, idx)], axis=1)), (idx.shape[0], -1))))
    return row_blocks.blockwise(xp, block, rows)


@_compat.jit_on_jax()
def _vertex_neighbours(xp, lab, count):
    """Flat ``(m V,)`` neighbours across the incoming and the outgoing edge of each
    vertex of the cells ``(labels, count)`` (a box side is replaced by the other
    one), and whether one exists."""
    k = xp.arange(lab.shape[1], dtype=xp.int64, device=aac.device(lab))[None, :]
    incoming = pg.incoming_labels(xp, lab, count)
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
    idx, ok = _compat.rows_where(xp, valid)
    found = xp.where(ok, row_blocks.blockwise(xp, find, xp.take(u, idx, axis=0), xp.take(row, idx), idx), -1)
    full = -xp.ones((m * cap,), dtype=xp.int64, device=aac.device(row))
    return xp.reshape(_compat.put_rows(xp, full, idx, found), (m, cap))


@_compat.jit_on_jax()
def _planes(xp, seeds, psi, active):
    """The planes ``f_j(v) = v . y_j + h_j``, ``h_j = (psi_j - |y_j|^2) / 2`` (-inf if
    inactive), as columns ``(y_j1, y_j2, h_j)`` of ``n + 1`` entries (the last, ``f =
    -inf``, for padding), and the rounding scale of ``h_j``, ``(|psi_j| + |y_j|^2) / 2``
    (0 on padding): :func:`_best_cutter`'s per-seed data, computed once per search, not
    per block."""
    dev = aac.device(seeds)
    h = xp.where(active, 0.5 * (psi - _compat.dot(seeds, seeds)), -xp.inf)
    pad = xp.zeros((1,), dtype=seeds.dtype, device=dev)
    columns = (xp.concat([seeds[:, 0], pad]), xp.concat([seeds[:, 1], pad]), xp.concat([h, pad - xp.inf]))
    return columns, xp.concat([0.5 * (xp.abs(psi) + _compat.dot(seeds, seeds)), pad])


@_compat.jit_on_jax()
def _best_cutter(xp, planes, h_scale, u, row, cand):
    """Per vertex ``u`` (P, 2) of the cell of seed ``row`` (P,), the candidate of
    ``cand`` (P, C) (-1: none) of least power if it is below the cell's own, else -1.

    With ``v = y_row + u`` and the ``planes`` ``f_j(v) = v . y_j + h_j`` (see
    :func:`_planes`), ``power_row(v) - power_j(v) = 2 (f_j(v) - f_row(v))``: a gather of
    each column per candidate (contiguous, unlike a gather of rows). The cell's own
    seed among the candidates gives ``f_row(v)``, not above it. A candidate cuts when
    ``f_j(v)`` exceeds ``f_row(v)`` by more than the rounding of both, each from its own
    terms: a seed far from the others (one Dirac at 1e6) only blunts the tests it takes
    part in.
    """
    px, py, ph = planes
    c = xp.where(cand >= 0, cand, px.shape[0] - 1)                    # padding: f = -inf
    yx, yy = xp.take(px, row), xp.take(py, row)
    vx, vy = yx + u[:, 0], yy + u[:, 1]
    ax, ay = xp.abs(vx), xp.abs(vy)
    eps = 64.0 * xp.finfo(u.dtype).eps
    f_own = vx * yx + vy * yy + xp.take(ph, row)
    own_tol = eps * (ax * xp.abs(yx) + ay * xp.abs(yy) + xp.take(h_scale, row))
    cx, cy = _compat.flat_take(px, c), _compat.flat_take(py, c)
    f = vx[:, None] * cx + vy[:, None] * cy + _compat.flat_take(ph, c)
    margin = f - eps * (ax[:, None] * xp.abs(cx) + ay[:, None] * xp.abs(cy) + _compat.flat_take(h_scale, c))
    best = xp.argmax(margin, axis=1)[:, None]
    found = xp.take_along_axis(margin, best, axis=1)[:, 0] > f_own + own_tol
    return xp.where(found, xp.take_along_axis(cand, best, axis=1)[:, 0], -1)


def exact_cutters(xp, seeds, psi, active, cells, rows):
    """For every vertex of the cells ``rows`` (m,), a seed that cuts it off, or -1: (m, V).

    Eagerly on the host, the candidates of cell i are its neighbours in the
    regular triangulation (:func:`..seed_neighbours.regular_neighbours`): the true cell is
    the box cut by their half-planes, so a convex cell whose vertices none of them
    cuts is exact. Otherwise, and for hidden seeds, the seed of least power at
    the vertex: a nearest-neighbour query among lifted seeds (:func:`lifted`).
    """
    cells = pg.take_rows(xp, cells, rows)
    m, cap = cells.labels.shape
    k = xp.arange(cap, dtype=xp.int64, device=aac.device(rows))[None, :]
    valid = xp.reshape(k < cells.count[:, None], (-1,))
    row_of = xp.reshape(xp.broadcast_to(rows[:, None], (m, cap)), (-1,))
    table = seed_neighbours.regular_neighbours(xp, seeds, psi, active)
    planes = _planes(xp, seeds, psi, active)
    if table is not None:
        hidden = xp.take(table[:, 0] < 0, row_of)
        found = _per_vertex(xp, cells, rows, valid & ~hidden, lambda u, row, idx: _best_cutter(
            xp, *planes, u, row, _compat.flat_take(table, row)))
        if not _compat.host_any(xp, valid & hidden):
            return found
        valid = valid & hidden
    points = lifted(xp, seeds, psi, active)

    def find(u, row, idx):
        q = u + xp.take(seeds, row, axis=0)
        q = xp.concat([q, xp.zeros((q.shape[0], 1), dtype=q.dtype, device=aac.device(q))], axis=1)
        return _best_cutter(xp, *planes, u, row, seed_neighbours.nearest(xp, points, q)[:, None])
    nearest = _per_vertex(xp, cells, rows, valid, find)
    return nearest if table is None else xp.maximum(found, nearest)


@_compat.jit_on_jax()
def lifted(xp, seeds, psi, active):
    """Lifted points ``(y_i, sqrt(M - psi_i))``; inactive seeds are lifted far away."""
    big = xp.max(xp.where(active, psi, -xp.inf))
    span = xp.max(seeds, axis=0) - xp.min(seeds, axis=0)
    far = big - 4.0 * xp.sum(span * span) - 1.0
    psi_eff = xp.where(active, psi, far)
    h = xp.sqrt(xp.maximum(big - psi_eff, 0.0))
    return xp.concat([seeds, h[:, None]], axis=1)


def _clip_rows(xp, seeds, psi, active, cells, rows, cut):
    """``cells`` with the cells ``rows`` clipped by their cutters ``cut`` (m, V);
    eagerly only the rows that have one."""
    if _compat.static_shapes(cut):
        width = 4
    else:
        has = xp.any(cut >= 0, axis=1)
        pick, _ = _compat.true_entries(xp, has)
        rows, cut = xp.take(rows, pick), xp.take(cut, pick, axis=0)
        width = max(_compat.to_int(xp.max(xp.sum(xp.astype(cut >= 0, xp.int64), axis=1))), 1)
    first = _compat.first_columns(xp, cut >= 0, cut, width, -1)      # the cutters of each row first
    sub = clip_by(xp, seeds, psi, active, pg.take_rows(xp, cells, rows), rows, first)
    return pg.put_rows(xp, cells, rows, sub)      # the cells being repaired are the solver's own
