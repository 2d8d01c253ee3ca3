"""Power (Laguerre) diagrams in 2D by vectorised half-plane clipping.

Cell ``i`` of seeds ``y`` with weights ``psi`` is

    L_i = { x in box : |x - y_i|^2 - psi_i <= |x - y_j|^2 - psi_j  for all j }.

In seed-relative coordinates ``u = x - y_i`` the constraint of neighbour j is
the half-plane ``u . d <= (|d|^2 + psi_i - psi_j) / 2`` with ``d = y_j - y_i``.

Each cell is first clipped by its K nearest seeds. It is then verified: with
the lifting ``Y_i = (y_i, sqrt(M - psi_i))``, ``M = max psi``, the power is
``|x - y_i|^2 - psi_i = |(x, 0) - Y_i|^2 - M``, so the seed of least power at a
vertex is the nearest lifted seed (one k-d tree query per vertex). A convex
cell none of whose vertices is cut off by any seed is exact (a half-plane that
keeps every vertex of a convex polygon keeps the polygon). Cells with cut
vertices are clipped by the cutters and verified again. (A security radius on
lifted k-NN alone fails when psi varies on the scale of the domain, as it does
after one Newton step: most cells then needed hundreds of candidates.)
Cells are polygons of
fixed capacity ``V`` (vertices stored counter-clockwise, relative to the seed);
each vertex carries the label of the edge that starts at it: the neighbour
index ``j >= 0``, or ``-1 - side`` for a side of the box.

The structure (k-NN candidates, one clipping round per candidate rank,
nearest-power verification, eager retries of the failing cells only) is dimension-neutral;
only :func:`clip_polygons` is specific to 2D.
"""
from __future__ import annotations

from typing import NamedTuple

import array_api_compat as aac

from . import _compat


class Cells(NamedTuple):
    """Clipped cells: ``vertices`` (n, V, 2) relative to the seeds, ``labels`` (n, V),
    ``count`` (n,), ``overflow`` / ``complete`` (n,) flags."""

    vertices: object
    labels: object
    count: object
    overflow: object
    complete: object


@_compat.jit_on_jax()
def lifted(xp, seeds, psi, active):
    """Lifted points ``(y_i, sqrt(M - psi_i))``; inactive seeds are lifted far away."""
    big = xp.max(xp.where(active, psi, -xp.inf))
    span = xp.max(seeds, axis=0) - xp.min(seeds, axis=0)
    far = big - 4.0 * xp.sum(span * span) - 1.0
    psi_eff = xp.where(active, psi, far)
    h = xp.sqrt(xp.maximum(big - psi_eff, 0.0))
    return xp.concat([seeds, h[:, None]], axis=1)


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
    return verts, labels, 4 * xp.astype(active, xp.int64)


@_compat.jit_on_jax()
def clip_polygons(xp, verts, labels, count, normal, offset, label, skip):
    """Clip each polygon by its half-plane ``u . normal <= offset`` (Sutherland-Hodgman).

    Returns the new ``(verts, labels, count, overflow)``; ``skip`` rows are unchanged.
    Each vertex k emits itself if inside, then the crossing point of edge
    (k, k+1) if the edge changes side; emitted items are compacted with a stable
    argsort so that the cyclic order is kept.
    """
    n, cap, _ = verts.shape
    dev = aac.device(verts)
    k = xp.arange(cap, dtype=xp.int64, device=dev)[None, :]
    valid = k < count[:, None]
    nxt = xp.where(k + 1 < count[:, None], k + 1, 0)
    rows = xp.arange(n, dtype=xp.int64, device=dev)[:, None] * cap
    flat_v = xp.reshape(verts, (n * cap, 2))
    s = xp.sum(verts * normal[:, None, :], axis=-1) - offset[:, None]
    s = xp.where(skip[:, None], -1.0, s)
    s_next = xp.reshape(xp.take(xp.reshape(s, (-1,)), xp.reshape(rows + nxt, (-1,))), (n, cap))
    v_next = _compat.flat_take(flat_v, rows + nxt)
    inside, inside_next = s <= 0, s_next <= 0
    crosses = valid & (inside != inside_next)
    denom = xp.where(crosses, s - s_next, 1.0)
    cut = verts + (s / denom)[..., None] * (v_next - verts)
    cut_label = xp.where(inside, label[:, None], labels)
    keep = xp.reshape(xp.stack([valid & inside, crosses], axis=2), (n, 2 * cap))
    cand_v = xp.reshape(xp.stack([verts, cut], axis=2), (n * 2 * cap, 2))
    cand_l = xp.reshape(xp.stack([labels, cut_label], axis=2), (-1,))
    order = xp.argsort(xp.astype(~keep, xp.int8), axis=1, stable=True)[:, :cap]
    pick = xp.arange(n, dtype=xp.int64, device=dev)[:, None] * (2 * cap) + order
    new_count = xp.sum(xp.astype(keep, xp.int64), axis=1)
    overflow = new_count > cap
    new_v = _compat.flat_take(cand_v, pick)
    new_l = xp.reshape(xp.take(cand_l, xp.reshape(pick, (-1,))), (n, cap))
    return new_v, new_l, xp.minimum(new_count, cap), overflow


def initial_cells(xp, seeds, psi, active, lo, hi, neighbours, capacity: int):
    """The box clipped by the candidates ``neighbours`` (n, K) of every seed."""
    n = seeds.shape[0]
    verts, labels, count = box_cells(xp, seeds, lo, hi, active, capacity)
    flags = xp.zeros((n,), dtype=xp.bool, device=aac.device(seeds))
    rows = xp.arange(n, dtype=xp.int64, device=aac.device(seeds))
    return clip_by(xp, seeds, psi, active, Cells(verts, labels, count, flags, ~flags), rows, neighbours)


def clip_by(xp, seeds, psi, active, cells, rows, neighbours):
    """Clip the cells of seeds ``rows`` (m,) by the candidates ``neighbours`` (m, K).

    A candidate equal to the row itself, inactive, or marking "none" (-1) is skipped.
    """
    for col in range(neighbours.shape[1]):
        cells = _clip_column(xp, seeds, psi, active, cells, rows, neighbours[:, col])
    return cells


@_compat.jit_on_jax()
def _clip_column(xp, seeds, psi, active, cells, rows, j):
    verts, labels, count, overflow, complete = cells
    none = j < 0
    j = xp.where(none, rows, j)
    d = _compat.flat_take(seeds, j) - _compat.flat_take(seeds, rows)
    offset = 0.5 * (xp.sum(d * d, axis=1) + xp.take(psi, rows) - xp.take(psi, j))
    skip = none | (j == rows) | ~xp.take(active, j) | (count == 0)
    verts, labels, count, over = clip_polygons(xp, verts, labels, count, d, offset, j, skip)
    return Cells(verts, labels, count, overflow | over, complete)


@_compat.jit_on_jax()
def _take_rows(xp, cells, rows):
    return Cells(*(_compat.flat_take(a, rows) for a in cells))


@_compat.jit_on_jax()
def _put_rows(xp, cells, rows, sub):
    return Cells(*(_compat.set_rows(xp, a, rows, b) for a, b in zip(cells, sub)))


def find_cutters(xp, seeds, psi, active, index, cells, rows):
    """For every vertex of the cells ``rows``, a seed that cuts it off, or -1.

    The seed of least power at a vertex ``v`` is the nearest lifted seed to
    ``(v, 0)`` (``index`` searches the lifted seeds, see :func:`lifted`); it
    cuts the vertex when its power is below the cell's own by more than the
    rounding of the half-plane test.
    """
    m, cap, _ = cells.vertices.shape
    queries, valid = _vertex_queries(xp, seeds, cells, rows)
    idx, queries = _valid_queries(xp, queries, valid, _compat.capacity(xp, xp.sum(xp.astype(valid, xp.int64)), valid, valid.shape[0]))
    found = index(queries, 1)[:, 0]
    return _cut_test(xp, seeds, psi, cells, rows, idx, found)


@_compat.jit_on_jax("size")
def _valid_queries(xp, queries, valid, size: int):
    idx, _ = _compat.select(xp, valid, size)
    return idx, xp.take(queries, idx, axis=0)


@_compat.jit_on_jax()
def _vertex_queries(xp, seeds, cells, rows):
    verts = cells.vertices
    m, cap, _ = verts.shape
    pts = xp.reshape(verts + _compat.flat_take(seeds, rows)[:, None, :], (m * cap, 2))
    k = xp.arange(cap, dtype=xp.int64, device=aac.device(pts))[None, :]
    valid = xp.reshape(k < cells.count[:, None], (-1,))
    return xp.concat([pts, xp.zeros((m * cap, 1), dtype=pts.dtype, device=aac.device(pts))], axis=1), valid


@_compat.jit_on_jax()
def _cut_test(xp, seeds, psi, cells, rows, idx, found):
    verts, count = cells.vertices, cells.count
    m, cap, _ = verts.shape
    own_flat = xp.reshape(xp.broadcast_to(rows[:, None], (m, cap)), (-1,))   # "no cutter"
    j = xp.reshape(_compat.set_rows(xp, own_flat, idx, found), (m, cap))
    own = _compat.flat_take(seeds, rows)
    d = _compat.flat_take(seeds, j) - own[:, None, :]
    own_psi = xp.take(psi, rows)[:, None]
    other_psi = xp.reshape(xp.take(psi, xp.reshape(j, (-1,))), tuple(j.shape))
    dd = xp.sum(d * d, axis=-1)
    s = xp.sum(verts * d, axis=-1) - 0.5 * (dd + own_psi - other_psi)
    ud = xp.sqrt(xp.sum(verts * verts, axis=-1) * dd)
    tol = 64.0 * xp.finfo(verts.dtype).eps * (ud + dd + xp.abs(own_psi - other_psi))
    k = xp.arange(cap, dtype=xp.int64, device=aac.device(verts))[None, :]
    cuts = (s > tol) & (k < count[:, None]) & (j != rows[:, None])
    return xp.where(cuts, j, -1)


def _repair(xp, seeds, psi, active, cells, rows, cutters):
    """Clip the cells ``rows`` by their ``cutters`` and put them back."""
    sub = clip_by(xp, seeds, psi, active, _take_rows(xp, cells, rows), rows, cutters)
    return _put_rows(xp, cells, rows, sub)


@_compat.jit_on_jax("size")
def _pick_rows(xp, rows, cutters, cut, size: int):
    """The ``size`` first rows with a cut vertex (padding rows get no cutter)."""
    keep, valid = _compat.select(xp, cut, size)
    return xp.take(rows, keep), xp.where(valid[:, None], _compat.flat_take(cutters, keep), -1)


def power_cells(xp, seeds, psi, active, lo, hi, k: int = 12, capacity: int = 16, rounds: int = 64):
    """Power cells of all seeds, exact up to rounding.

    Each cell is clipped by its ``k`` nearest seeds, then every vertex is
    checked against the seed of least power there (a nearest-neighbour query
    in lifted space); cells with a vertex cut off are clipped by the cutters
    and checked again, until no vertex is cut. If a cell overflows the vertex
    capacity, everything is rebuilt with twice the capacity. Eagerly, rounds
    repeat until every cell is verified; the ``complete`` and ``overflow``
    flags report what could not be (under tracing, or after ``rounds``).
    """
    n = seeds.shape[0]
    neighbours = _compat.knn(xp, seeds, min(k + 1, n))
    index = _compat.knn_index(xp, lifted(xp, seeds, psi, active))   # built once, queried per round
    while True:
        cells = initial_cells(xp, seeds, psi, active, lo, hi, neighbours, capacity)
        rows = xp.arange(n, dtype=xp.int64, device=aac.device(seeds))
        for _ in range(rounds):
            sub = _take_rows(xp, cells, rows)
            cutters = find_cutters(xp, seeds, psi, active, index, sub, rows)
            cut = xp.any(cutters >= 0, axis=1)
            if not _compat.host_any(xp, cut):
                break
            size = _compat.capacity(xp, xp.sum(xp.astype(cut, xp.int64)), cut, cut.shape[0])
            rows, cutters = _pick_rows(xp, rows, cutters, cut, size)
            cells = _repair(xp, seeds, psi, active, cells, rows, cutters)
        else:
            unverified = _compat.set_rows(xp, xp.zeros((n,), dtype=xp.bool), rows, cut)
            cells = cells._replace(complete=~unverified)
        if not _compat.host_any(xp, cells.overflow) or capacity >= 1024:
            return cells
        capacity *= 2
