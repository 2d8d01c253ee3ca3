"""Between Newton trials: the previous cells' combinatorics moved to new weights.

Each vertex of a cell (:mod:`.polyhedra`) is the meeting point of three facets, each the
plane of a neighbour (or a side of the box) at the current weights: at new weights the
vertex moves to the new meeting point (Cramer's rule), and the cell keeps its edges as
long as no edge shrinks through zero length. That test is local (per edge); whether a new
neighbour cuts the cell is for the volume certificate (:mod:`.diagram`) to say.
"""
from __future__ import annotations

import array_api_compat as aac

from .. import _compat, row_blocks
from .polyhedra import CELL_CHUNK, live_vertices



def moved(xp, seeds, psi, lo, hi, cells):
    """See :func:`_moved_all`; eagerly on the live vertices alone (:func:`_moved_listed`)."""
    if _compat.static_shapes(cells.vertices) or aac.is_jax_array(cells.vertices):
        return _moved_all(xp, seeds, psi, lo, hi, cells)
    rows = xp.arange(seeds.shape[0], dtype=xp.int64, device=aac.device(seeds))
    vertices, valid = row_blocks.blockwise(xp, lambda *block: _moved_chunks(xp, seeds, psi, lo, hi, cells, *block),
                                        rows, cells.vertices, cells.corners, cells.adjacent, cells.size, cells.labels)
    return cells._replace(vertices=vertices), valid


def moved_rows(xp, seeds, psi, lo, hi, cells, rows):
    """Eagerly (NumPy, torch), whether the cells ``rows`` of ``cells`` keep their edges at
    weights ``psi`` (the ``valid`` of :func:`moved` at those rows)."""
    fields = (xp.take(getattr(cells, f), rows, axis=0) for f in ("vertices", "corners", "adjacent", "size", "labels"))
    return _moved_chunks(xp, seeds, psi, lo, hi, cells, rows, *fields)[1]


def _moved_chunks(xp, seeds, psi, lo, hi, cells, rows, *fields):
    """:func:`_moved_listed` on the cells ``rows`` (their ``fields``: vertices, corners,
    adjacent, size, labels), chunk after chunk of :data:`CELL_CHUNK` cells:
    ``(vertices, valid)``."""
    m = rows.shape[0]
    parts = []
    for start in range(0, max(m, 1), CELL_CHUNK):
        stop = min(start + CELL_CHUNK, m)
        chunk = cells._replace(**{f: a[start:stop, ...] for f, a in
                                  zip(("vertices", "corners", "adjacent", "size", "labels"), fields)})
        part, valid = _moved_listed(xp, seeds, psi, lo, hi, chunk, rows[start:stop])
        parts.append((part.vertices, valid))
    return xp.concat([p[0] for p in parts], axis=0), xp.concat([p[1] for p in parts], axis=0)


def _planes_of(xp, seeds, psi, cell, labels, lo, hi):
    """The planes ``u . normal = offset`` (seed-relative) of the facets ``labels`` (any
    shape ``S``) of the cells ``cell`` (shape ``S``): ``(normal S + (3,), offset S)``."""
    y = xp.take(seeds, xp.reshape(cell, (-1,)), axis=0)
    y = xp.reshape(y, tuple(cell.shape) + (3,))
    j = xp.where(labels >= 0, labels, 0)
    d = _compat.flat_take(seeds, j) - y
    b = 0.5 * (_compat.dot(d, d) + _compat.flat_take(psi, cell) - _compat.flat_take(psi, j))
    side = xp.where((labels < 0) & (labels >= -6), -1 - labels, 0)
    axis, upper = side // 2, side % 2 == 1
    unit = xp.astype(axis[..., None] == xp.arange(3, dtype=xp.int64, device=aac.device(labels)), y.dtype)
    box_normal = unit * (2.0 * xp.astype(upper, y.dtype) - 1.0)[..., None]
    bound = xp.where(upper[..., None], hi, lo) - y
    is_seed = labels >= 0
    return xp.where(is_seed[..., None], d, box_normal), xp.where(is_seed, b, _compat.dot(box_normal, bound))


def cramer(xp, n3, b3):
    """The meeting point ``u`` of three planes (normals ``n3`` (..., 3, 3), offsets ``b3``
    (..., 3)) by Cramer's rule, and whether it is well defined."""
    p, q, r = n3[..., 0, :], n3[..., 1, :], n3[..., 2, :]
    qr, rp, pq = _cross3(xp, q, r), _cross3(xp, r, p), _cross3(xp, p, q)
    det = _compat.dot(p, qr)
    ok = xp.abs(det) > 1e-9 * xp.sqrt(_compat.dot(p, p) * _compat.dot(q, q) * _compat.dot(r, r))
    u = (b3[..., 0:1] * qr + b3[..., 1:2] * rp + b3[..., 2:3] * pq) / xp.where(ok, det, 1.0)[..., None]
    return u, ok


def _edges_hold(xp, n3, b3, far):
    """Edge k's far end ``far[..., k, :]`` strictly inside the plane of facet ``p_k``."""
    gap = xp.sum(n3 * far, axis=-1) - b3
    tol = 64.0 * xp.finfo(far.dtype).eps * (xp.abs(b3) + xp.sqrt(_compat.dot(n3, n3)) * xp.sqrt(_compat.dot(far, far)))
    return xp.all(gap < -tol, axis=-1)


def _moved_listed(xp, seeds, psi, lo, hi, cells, rows):
    """:func:`_moved_all` on the list of live vertices of ``cells``, those of the seeds ``rows``."""
    n, v_cap, _ = cells.vertices.shape
    f_cap = cells.labels.shape[1]
    at = xp.nonzero(xp.reshape(live_vertices(xp, cells), (-1,)))[0]
    cell = at // v_cap
    corners = xp.take(xp.reshape(cells.corners, (n * v_cap, 3)), at, axis=0)
    labels = xp.take(xp.reshape(cells.labels, (-1,)), xp.reshape(cell[:, None] * f_cap + corners, (-1,)))
    cell3 = xp.broadcast_to(cell[:, None], corners.shape)
    seed3 = xp.broadcast_to(xp.take(rows, cell)[:, None], corners.shape)
    n3, b3 = _planes_of(xp, seeds, psi, seed3, xp.reshape(labels, corners.shape), lo, hi)
    u, ok = cramer(xp, n3, b3)
    flat = _compat.set_rows(xp, xp.reshape(cells.vertices, (n * v_cap, 3)), at, u)
    far_idx = cell3 * v_cap + xp.take(xp.reshape(cells.adjacent, (n * v_cap, 3)), at, axis=0)
    far = xp.reshape(xp.take(flat, xp.reshape(far_idx, (-1,)), axis=0), n3.shape)
    bad = ~(ok & _edges_hold(xp, n3, b3, far))
    valid = _compat.segment_sum(xp, xp.astype(bad, xp.int64), cell, n) == 0
    return cells._replace(vertices=xp.reshape(flat, cells.vertices.shape)), valid


@_compat.jit_on_jax()
def _moved_all(xp, seeds, psi, lo, hi, cells):
    """``cells`` (a diagram of the same seeds at other weights) with their combinatorics
    kept and their vertices moved to the weights ``psi``: each vertex the meeting point of
    its three facets' planes (Cramer's rule), and ``(n,)`` whether the cell is still valid:
    every edge keeps its far end strictly inside the plane of the third facet at its near
    end (no edge has shrunk through zero), every vertex well defined. A valid cell is the
    intersection of its facets' half-spaces; whether some other seed cuts it is for the
    volume certificate to say."""
    n, v_cap, _ = cells.vertices.shape
    live = live_vertices(xp, cells)
    c = xp.where(live[..., None], cells.corners, 0)
    labels = _compat.row_gather(cells.labels, c)                  # (n, V, 3): the three facets
    cell = xp.broadcast_to(xp.arange(n, dtype=xp.int64, device=aac.device(c))[:, None, None], c.shape)
    n3, b3 = _planes_of(xp, seeds, psi, cell, labels, lo, hi)
    u, ok = cramer(xp, n3, b3)
    ok = live & ok
    u = xp.where(ok[..., None], u, cells.vertices)
    far = _compat.row_gather(u, xp.where(live[..., None], cells.adjacent, 0))      # (n, V, 3, 3)
    ok = ok & _edges_hold(xp, n3, b3, far)
    return cells._replace(vertices=u), xp.all(ok | ~live, axis=1)


def _cross3(xp, u, v):
    return xp.stack([u[..., 1] * v[..., 2] - u[..., 2] * v[..., 1], u[..., 2] * v[..., 0] - u[..., 0] * v[..., 2],
                     u[..., 0] * v[..., 1] - u[..., 1] * v[..., 0]], axis=-1)
