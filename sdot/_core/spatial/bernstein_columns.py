"""What the pieces of :mod:`.bernstein` need of the rows of voxels their x-primitives cross:
the prefix tables along x, and per piece its :class:`.bernstein_pieces.Column` (its voxel's
coefficients, the base column's and the whole columns' parts of the primitives) and the
transpose of that gather.

Along x, the row ``(j, k)`` of voxels carries per ``(k1, k2)`` the piecewise polynomial
``r_(k1 k2)(s) = sum_k0 c[l, j, k, k0, k1, k2] B_k0(t0(s))`` on voxel ``l``; its prefix tables
(:func:`prefix_tables`)

    A_m[(j, k), i, (k1, k2)] = sum_(l < i) int_(X_l)^(X_(l+1)) r_(k1 k2)(s) (s - lo_0)^m ds,

``m = 0, 1, 2``, give the whole columns between a piece and its cell's origin ``o``: with
``d_m`` the difference of the entries at the piece's and the base column's ends (as in
:mod:`.faces`) and ``b = o_x - lo_0``, ``T_0 = d_0``, ``T_1 = d_1 - b d_0``, ``T_2 = d_2 - 2 b d_1 +
b^2 d_0`` are their parts of ``G_m = int_(o_x)^x rho (s - o_x)^m ds``. The base column's part
(from ``o_x`` to its side ``E`` towards the piece) is ``sum_k0 c_base[k0] beta_m[k0]``,
``beta_m[k0] = int_0^E B_k0(t0(o_x + s)) s^m ds``, by the line rule (exact: degree ``p + 2``).
Both are 0 for a piece in the base column, whose primitive starts at ``o_x`` itself.
"""
from __future__ import annotations

import array_api_compat as aac

from .. import _compat
from . import faces
from .bernstein_pieces import Column, bernstein, line_rule


def degree(shape) -> int:
    """The degree ``p`` of coefficients of shape ``(n0, n1, n2, (p + 1)^3)``."""
    count = int(shape[-1])
    p = round(count ** (1.0 / 3.0)) - 1
    if (p + 1) ** 3 != count:
        raise ValueError(f"sdot: {count} Bernstein coefficients per voxel is not a cube (p + 1)^3")
    return p


def _column_weights(xp, n0, p, lo, hi, dtype, dev):
    """``mu_m[l, k0] = int_(X_l)^(X_(l+1)) B_k0(t0(s)) (s - lo_0)^m ds`` (m = 0, 1, 2), each
    ``(n0, p + 1)``, by the line rule (exact: degree ``p + 2``)."""
    h = (hi[0] - lo[0]) / n0
    start = h * xp.arange(n0, dtype=dtype, device=dev)
    mu = [0.0, 0.0, 0.0]
    for xi, w in zip(*line_rule(p + 2)):
        basis = bernstein(xp, xp.asarray(xi, dtype=dtype, device=dev), p)[None, :]
        s = (start + xi * h)[:, None]
        mu = [mu[0] + (w * h) * basis, mu[1] + (w * h) * s * basis, mu[2] + (w * h) * s * s * basis]
    return mu


@_compat.jit_on_jax()
def prefix_tables(xp, coefficients, lo, hi):
    """``A_m`` (m = 0, 1, 2 of the module docstring), ``(3, n1 n2 (n0 + 1), (p + 1)^2)``: row
    ``(j n2 + k) (n0 + 1) + i``, column ``k1 (p + 1) + k2``."""
    n0, n1, n2, _ = coefficients.shape
    p = degree(coefficients.shape)
    R = (p + 1) * (p + 1)
    dev = aac.device(coefficients)
    c = xp.reshape(coefficients, (n0, n1 * n2, p + 1, R))
    zero = xp.zeros((1, n1 * n2, R), dtype=coefficients.dtype, device=dev)
    tables = []
    for mu in _column_weights(xp, n0, p, lo, hi, coefficients.dtype, dev):
        columns = xp.sum(c * mu[:, None, :, None], axis=2)                      # (n0, rows, R)
        table = xp.concat([zero, xp.cumulative_sum(columns, axis=0)], axis=0)    # (n0 + 1, rows, R)
        tables.append(xp.reshape(xp.permute_dims(table, (1, 0, 2)), (n1 * n2 * (n0 + 1), R)))
    return xp.stack(tables)


@_compat.jit_on_jax("shape")
def through_tables(xp, g_tables, g_voxels, shape, lo, hi):
    """The gradients of the blocks summed (rows of ``g_tables`` ``(n1 n2 (n0 + 1), 3, R)``,
    w.r.t. the tables, and of ``g_voxels`` ``(n0 n1 n2, p + 1, R)``, w.r.t. the coefficients
    directly), the first taken through the prefix sums and the column weights."""
    n0, n1, n2, _ = shape
    dtype, dev = g_voxels.dtype, aac.device(g_voxels)
    p = degree(shape)
    R = (p + 1) * (p + 1)
    g_tables = xp.sum(g_tables, axis=0)
    g_voxels = xp.sum(g_voxels, axis=0)
    g = xp.reshape(xp.permute_dims(g_tables, (1, 0, 2)), (3, n1 * n2, n0 + 1, R))
    # A[l] = sum_(l' < l) col[l']: d col[l'] = sum_(l > l') d A[l], a suffix sum
    suffix = xp.flip(xp.cumulative_sum(xp.flip(g[:, :, 1:, :], axis=2), axis=2), axis=2)   # (3, rows, n0, R)
    through = 0.0
    for m, mu in enumerate(_column_weights(xp, n0, p, lo, hi, dtype, dev)):
        through = through + suffix[m, :, :, None, :] * mu[None, :, :, None]        # (rows, n0, p + 1, R)
    through = xp.permute_dims(through, (1, 0, 2, 3))                              # (n0, rows, p + 1, R)
    return xp.reshape(g_voxels, shape) + xp.reshape(through, shape)


def column(xp, grid, p, layout, cell, index, sources=None):
    """The :class:`.bernstein_pieces.Column` of the pieces of cells ``cell`` (P,) in voxels
    ``index`` (3 arrays), in ``layout``, with its ``rows`` if ``sources`` (the coefficients
    ``(voxels, p + 1, R)`` and the tables ``(3, entries, R)``) are given; and
    ``transpose(d_rows)``, a gradient of ``rows`` taken to the voxels' coefficients
    (``(voxel, values (2P, p + 1, R))``, the piece's and the base one's) and to the table
    entries (``(at, values (2P, 3, R))``, the piece's end and, negated, the base column's)."""
    i, j, k = index
    first = layout.first
    dtype = grid.sl.dtype
    sl = [xp.take(grid.sl[:, a], cell) for a in range(3)]
    ib = xp.take(grid.base, cell)
    vox = faces._Voxel(xp, grid, i, j, k, sl[0], ib)
    scale = [grid.scale[a] for a in range(3)]
    t_origin = sl[0] * scale[0]
    t_B = xp.where(i > ib, 0.0, xp.where(i < ib, 1.0, t_origin - xp.astype(i, dtype)))
    offset = [sl[1] * scale[1] - xp.astype(j, dtype), sl[2] * scale[2] - xp.astype(k, dtype)]
    # the base column's part: beta[m, k0] = int from o_x to its side E towards the piece of
    # B_k0 (s - o_x)^m ds, (P, 3, p + 1) (first) or (3, p + 1, P)
    E, axis = vox.E, -1 if first else 0
    start = t_origin - xp.astype(ib, dtype)
    beta = 0.0
    for xi, w in zip(*line_rule(p + 2)):
        basis = bernstein(xp, start + xi * E * scale[0], p, axis=axis) * layout.scalar(w * E)
        beta = beta + xp.stack([basis, basis * layout.scalar(xi * E), basis * layout.scalar((xi * E) ** 2)],
                               axis=1 if first else 0)
    b = sl[0]
    piece = (lambda a: a[:, None]) if first else (lambda a: a)
    col = Column(p, layout, None, piece(vox.B), piece(t_B), [piece(a) for a in offset], scale)
    if sources is not None:
        flat, tables = sources
        if first:
            c = xp.take(flat, vox.voxel, axis=0)                                         # (P, p + 1, R)
            base = xp.matmul(beta, xp.take(flat, vox.base_voxel, axis=0))               # (P, 3, R)
            d = [xp.take(tables[m, ...], vox.at, axis=0) - xp.take(tables[m, ...], vox.at_base, axis=0)
                 for m in range(3)]
            b_ = b[:, None]
        else:   # gathers from the transposed sources: C-ordered (k, R, P)
            flat, tables = xp.permute_dims(flat, (1, 2, 0)), xp.permute_dims(tables, (0, 2, 1))
            c = xp.take(flat, vox.voxel, axis=2)
            base = xp.sum(beta[:, :, None, :] * xp.take(flat, vox.base_voxel, axis=2)[None, ...], axis=1)
            d = [xp.take(tables[m, ...], vox.at, axis=1) - xp.take(tables[m, ...], vox.at_base, axis=1)
                 for m in range(3)]
            b_ = b
        whole = xp.stack([d[0], d[1] - b_ * d[0], d[2] - 2.0 * b_ * d[1] + b_ * b_ * d[0]], axis=1 if first else 0)
        col.rows = xp.concat([c, base + whole], axis=1)[:, None, ...] if first else xp.concat([c, base + whole])

    def transpose(d_rows):
        if not first:
            d_rows = xp.permute_dims(d_rows, (2, 0, 1))
        d_c, d_K = d_rows[:, :p + 1, :], d_rows[:, p + 1:, :]
        d_base = xp.matmul(xp.permute_dims(beta, (0, 2, 1) if first else (2, 1, 0)), d_K)    # (P, p + 1, R)
        K, b_ = [d_K[:, m, :] for m in range(3)], b[:, None]
        d_tables = xp.stack([K[0] - b_ * K[1] + b_ * b_ * K[2], K[1] - 2.0 * b_ * K[2], K[2]], axis=1)
        return ((xp.concat([vox.voxel, vox.base_voxel]), xp.concat([d_c, d_base], axis=0)),
                (xp.concat([vox.at, vox.at_base]), xp.concat([d_tables, -d_tables], axis=0)))
    return col, transpose
