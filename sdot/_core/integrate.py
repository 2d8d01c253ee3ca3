"""Exact integrals of a piecewise-constant grid density over polygons and edges.

Integrals over a cell become contour integrals (divergence theorem):
``int_P rho f = oint F dv`` with ``F(u, v) = int_{X_b}^{x} rho(s, y) f(s, y) ds``,
in seed-relative coordinates ``u = x - y_i``, ``v = y - y_i``; the base
``X_b`` is the left side of the grid column holding the seed, so that cells
inside one column need no prefix table at all (no cancellation). Edges are
split at every grid line, so that each piece lies in one pixel where F is a
polynomial: with the row prefix tables ``A_m[j, i] = sum_{k<i} c_kj (X_{k+1}^m -
X_k^m)``, ``F`` on pixel (i, j) is

    T_p + c_ij ((u^{p+1} - U_i^{p+1}) / (p+1)),   U_i = X_i - x_i,
    T_p = 1/(p+1) sum_m binom(p+1, m) (-x_i)^{p+1-m} (A_m[j, i] - A_m[j, i_s]),

for ``f = u^p``, times ``v^q`` for ``f = u^p v^q``. The integrand along a piece
is a polynomial of degree <= 3, integrated exactly by 2-point Gauss-Legendre.
Computed per cell: mass, first moments about the seed, second moment about the
seed (the transport cost), and the density integrated along every edge.
"""
from __future__ import annotations

import math

import array_api_compat as aac

from . import _compat

_GAUSS = (0.5 - 0.5 / math.sqrt(3.0), 0.5 + 0.5 / math.sqrt(3.0))


def prefix_tables(xp, density, lo, hi):
    """``A_m`` (m = 1, 2, 3) of shape (n_y, n_x + 1) for a density ``(n_x, n_y)``."""
    nx = density.shape[0]
    dev = aac.device(density)
    xs = lo[0] + (hi[0] - lo[0]) * xp.arange(nx + 1, dtype=density.dtype, device=dev) / nx
    zero = xp.zeros((density.shape[1], 1), dtype=density.dtype, device=dev)
    tables = []
    for m in (1, 2, 3):
        band = xs[1:] ** m - xs[:-1] ** m                       # (nx,)
        terms = xp.permute_dims(density, (1, 0)) * band[None, :]  # (ny, nx)
        tables.append(xp.concat([zero, xp.cumulative_sum(terms, axis=1)], axis=1))
    return xp.stack(tables)                                      # (3, ny, nx + 1)


def _expand(xp, counts, size: int):
    """``size >= sum(counts)`` slots: the owner of each slot, its rank in it, validity."""
    dev = aac.device(counts)
    ends = xp.cumulative_sum(counts)
    slots = xp.arange(size, dtype=counts.dtype, device=dev)
    owner = xp.clip(xp.searchsorted(ends, slots, side="right"), 0, counts.shape[0] - 1)
    start = xp.take(ends - counts, owner)
    return owner, slots - start, slots < ends[-1]


def _grid_coords(xp, points, lo, hi, shape):
    g = (points - lo) / (hi - lo) * shape
    return xp.clip(g, 0.0, shape)


@_compat.jit_on_jax("grid_shape")
def _edges(xp, seeds, cells, lo, hi, grid_shape):
    """Every edge slot: endpoints (relative), grid coordinates, grid-line crossings."""
    verts, count = cells.vertices, cells.count
    n, cap, _ = verts.shape
    dev = aac.device(verts)
    k = xp.arange(cap, dtype=xp.int64, device=dev)[None, :]
    base = xp.arange(n, dtype=xp.int64, device=dev)[:, None] * cap
    nxt = xp.reshape(base + xp.where(k + 1 < count[:, None], k + 1, 0), (-1,))
    a = xp.reshape(verts, (n * cap, 2))
    b = xp.take(a, nxt, axis=0)
    valid = xp.reshape(k < count[:, None], (-1,))
    seed = xp.take(seeds, xp.reshape(xp.broadcast_to(xp.arange(n, device=dev)[:, None], (n, cap)), (-1,)), axis=0)
    shape = xp.asarray(grid_shape, dtype=verts.dtype, device=dev)
    ga = _grid_coords(xp, seed + a, lo, hi, shape)
    gb = _grid_coords(xp, seed + b, lo, hi, shape)
    ncross = xp.astype(xp.abs(xp.floor(gb) - xp.floor(ga)), xp.int64) * xp.astype(valid, xp.int64)[:, None]
    return a, b, ga, gb, ncross, valid


def piece_sizes(xp, seeds, cells, lo, hi, grid_shape):
    """Sizes to allocate: valid edges, grid-line crossings, pieces (eager only)."""
    *_, ncross, valid = _edges(xp, seeds, cells, lo, hi, grid_shape)
    n_edges = xp.sum(xp.astype(valid, xp.int64))
    n_cross = xp.sum(ncross)
    slots = valid.shape[0]
    return (_compat.capacity(xp, n_edges, valid, slots), _compat.capacity(xp, n_cross, valid),
            _compat.capacity(xp, n_edges + n_cross, valid))


def edge_pieces(xp, seeds, cells, lo, hi, grid_shape, sizes):
    """Split every valid cell edge at every grid line.

    ``sizes`` = (edges, crossings, pieces) capacities (see :func:`piece_sizes`).
    Returns a dict with, per piece: ``edge`` (index into the edge list), the
    relative endpoints ``p``/``q`` (m, 2), the pixel ``ix``/``iy``; and per edge:
    ``cell``, ``label``, ``valid``.
    """
    n_edges, n_cross_cap, n_piece_cap = sizes
    a, b, ga, gb, ncross, valid = _edges(xp, seeds, cells, lo, hi, grid_shape)
    cap = cells.vertices.shape[1]
    ids, valid = _compat.select(xp, valid, n_edges)
    a, b, ga, gb = (xp.take(v, ids, axis=0) for v in (a, b, ga, gb))
    ncross = xp.take(ncross, ids, axis=0) * xp.astype(valid, xp.int64)[:, None]
    fa, fb = xp.floor(ga), xp.floor(gb)
    n_x, n_y = ncross[:, 0], ncross[:, 1]
    cell = ids // cap
    seed = xp.take(seeds, cell, axis=0)

    # crossings: owner edge, t along the edge, sorted by (edge, t)
    n_cross = n_x + n_y
    owner, m, real = _expand(xp, n_cross, n_cross_cap)
    on_x = m < xp.take(n_x, owner)
    axis_m = xp.where(on_x, m, m - xp.take(n_x, owner))
    lo_f = xp.minimum(xp.take(fa, owner, axis=0), xp.take(fb, owner, axis=0))
    ga_o, gb_o = xp.take(ga, owner, axis=0), xp.take(gb, owner, axis=0)
    line = lo_f + 1.0 + xp.astype(axis_m, a.dtype)[:, None]
    den = gb_o - ga_o
    den = xp.where(den == 0, 1.0, den)
    t_all = (line - ga_o) / den
    t = xp.where(real, xp.clip(xp.where(on_x, t_all[:, 0], t_all[:, 1]), 0.0, 1.0), 2.0)
    order = xp.argsort(t, stable=True)
    order = xp.take(order, xp.argsort(xp.take(owner, order), stable=True))
    t_sorted = xp.take(t, order)

    # pieces: consecutive breakpoints 0 < t_1 <= ... <= 1 of each edge
    n_pieces = (n_cross + 1) * xp.astype(valid, xp.int64)
    edge, r, real = _expand(xp, n_pieces, n_piece_cap)
    first = xp.take(xp.cumulative_sum(n_cross) - n_cross, edge)
    last_t = max(t_sorted.shape[0] - 1, 0)
    pad = xp.concat([t_sorted, xp.zeros((1,), dtype=a.dtype, device=aac.device(a))])
    t0 = xp.where(r == 0, 0.0, xp.take(pad, xp.clip(first + r - 1, 0, last_t)))
    t1 = xp.where(r == xp.take(n_cross, edge), 1.0, xp.take(pad, xp.clip(first + r, 0, last_t)))
    t1 = xp.where(real, t1, t0)                     # padding: empty pieces
    ae, be = xp.take(a, edge, axis=0), xp.take(b, edge, axis=0)
    p = ae + t0[:, None] * (be - ae)
    q = ae + t1[:, None] * (be - ae)
    shape = xp.asarray(grid_shape, dtype=a.dtype, device=aac.device(a))
    mid = _grid_coords(xp, xp.take(seed, edge, axis=0) + 0.5 * (p + q), lo, hi, shape)
    pix = xp.astype(xp.floor(mid), xp.int64)
    ix = xp.clip(pix[:, 0], 0, grid_shape[0] - 1)
    iy = xp.clip(pix[:, 1], 0, grid_shape[1] - 1)
    return dict(edge=edge, p=p, q=q, ix=ix, iy=iy, cell=cell,
                label=xp.take(xp.reshape(cells.labels, (-1,)), ids), valid=valid)


def cell_integrals(xp, seeds, cells, density, lo, hi):
    """See :func:`integrals` (this computes the sizes to allocate, eagerly)."""
    sizes = piece_sizes(xp, seeds, cells, lo, hi, tuple(density.shape))
    return integrals(xp, seeds, cells, density, lo, hi, sizes)


@_compat.jit_on_jax("sizes")
def integrals(xp, seeds, cells, density, lo, hi, sizes):
    """Per cell ``(mass, M_x, M_y, M_2)`` about the seed, and per edge the density
    integrated along it, with the edge's ``cell`` and ``label``.

    ``M_x = int (x - y_i) rho``, ``M_2 = int |x - y_i|^2 rho`` over the cell.
    """
    n = seeds.shape[0]
    grid_shape = tuple(density.shape)
    pc = edge_pieces(xp, seeds, cells, lo, hi, grid_shape, sizes)
    tables = prefix_tables(xp, density, lo, hi)
    dx = (hi[0] - lo[0]) / grid_shape[0]
    cell_of = xp.take(pc["cell"], pc["edge"])
    sx = xp.take(seeds[:, 0], cell_of)
    col_seed = xp.astype(xp.floor((seeds[:, 0] - lo[0]) / dx), xp.int64)
    i_s = xp.take(xp.clip(col_seed, 0, grid_shape[0] - 1), cell_of)
    ix, iy = pc["ix"], pc["iy"]
    width = grid_shape[0] + 1
    flat = xp.reshape(tables, (3, -1))
    d1, d2, d3 = (xp.take(flat[m, :], iy * width + ix) - xp.take(flat[m, :], iy * width + i_s)
                  for m in range(3))
    t0 = d1
    t1 = 0.5 * (d2 - 2.0 * sx * d1)
    t2 = (d3 - 3.0 * sx * d2 + 3.0 * sx * sx * d1) / 3.0
    c = xp.take(xp.reshape(density, (-1,)), ix * grid_shape[1] + iy)
    u_left = lo[0] + dx * xp.astype(ix, seeds.dtype) - sx
    p, q = pc["p"], pc["q"]
    dv = q[:, 1] - p[:, 1]
    acc = 0.0
    for tau in _GAUSS:
        u = p[:, 0] + tau * (q[:, 0] - p[:, 0])
        v = p[:, 1] + tau * dv
        f0 = t0 + c * (u - u_left)
        f1 = t1 + c * (u * u - u_left * u_left) * 0.5
        f2 = t2 + c * (u * u * u - u_left * u_left * u_left) / 3.0
        acc = acc + xp.stack([f0, f1, v * f0, f2 + v * v * f0], axis=1)
    per_piece = 0.5 * dv[:, None] * acc
    moments = _compat.segment_sum(xp, per_piece, cell_of, n)
    length = xp.sqrt(xp.sum((q - p) ** 2, axis=1))
    facet = _compat.segment_sum(xp, c * length, pc["edge"], sizes[0])
    return moments, dict(cell=pc["cell"], label=pc["label"], valid=pc["valid"], rho=facet)
