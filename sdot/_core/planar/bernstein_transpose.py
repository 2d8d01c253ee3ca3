"""The transpose of :mod:`.bernstein`: per grid cell and Bernstein basis function, the
integral of a quadratic polynomial per Laguerre cell (the gradient of W2^2 with respect to
the coefficients of a Bernstein grid density).

The cell moments of :func:`.bernstein.bernstein_cell_integrals` are linear in the monomial
coefficients ``a`` of the grid cells, which enter the walk twice: directly in the piece's own
cell (``K_b``) and through the row prefix tables ``T_m`` (``Pre_a``). The same walk takes
each term of ``sum_i int_{L_i} (a_i + b_i . u + c_i |u|^2) rho`` back to what it reads: the
piece's cell by a scatter-add, the tables by a scatter-add then a reverse cumulative sum
along the rows (``T_m[j, i] = sum_{k < i} band_m[k, j]``); then to the Bernstein
coefficients by the transposed change of basis (``a = M^T c M``: ``dQ/dc = M dQ/da M^T``).
"""
from __future__ import annotations

import math

import array_api_compat as aac

from .. import _compat, row_blocks
from ..quadrature import change_of_basis, gauss_legendre
from .bernstein import _band_integrals, _PieceFrame
from .contour import Edges, far_origins, PieceGrid, visit_pieces
from .sensitivity import _moved_coefficients


def bernstein_potential_integrals(xp, seeds, cells, psi, lo, hi, coefficient_shape):
    """Per grid cell and basis function ``k``, ``sum_i int_{L_i & cell} B_k (|x - y_i|^2 - psi_i)``,
    shape ``coefficient_shape`` (n0, n1, (p+1)^2): the derivative of
    ``Q = sum_i int_{L_i} (|x - y_i|^2 - psi_i) rho`` with respect to the Bernstein
    coefficients (cells fixed), :func:`bernstein_polynomial_integrals` of ``(-psi, 0, 0, 1)``."""
    zero = xp.zeros_like(psi)
    coefficients = xp.stack([-psi, zero, zero, xp.ones_like(psi)], axis=1)
    return bernstein_polynomial_integrals(xp, seeds, cells, coefficients, lo, hi, coefficient_shape)


def bernstein_polynomial_integrals(xp, seeds, cells, coefficients, lo, hi, coefficient_shape):
    """Per grid cell and basis function ``B_k`` (``B(k0, p, t0) B(k1, p, t1)``),
    ``sum_i int_{L_i & cell} B_k (a_i + b_i . u + c_i |u|^2) dx``, ``u = x - y_i``.

    Parameters
    ----------
    xp : module
        Array namespace.
    seeds : array (n, 2)
        The seeds.
    cells : Cells
        Their cells (``vertices`` relative to the seeds, ``count``).
    coefficients : array (n, 4)
        ``(a_i, b_ix, b_iy, c_i)`` per cell.
    lo, hi : array (2,)
        The box.
    coefficient_shape : tuple of int
        ``(n0, n1, (p+1)^2)``, the shape of the density's Bernstein coefficients.

    Returns
    -------
    array of shape ``coefficient_shape``
        The transpose of the map from the Bernstein coefficients to the cell moments of
        :func:`bernstein_cell_integrals`: ``sum(result * c) == sum(coefficients * moments(c))``.
    """
    n0, n1, nn = (int(s) for s in coefficient_shape)
    n = math.isqrt(nn)
    origin = far_origins(xp, cells.vertices, cells.count)
    vertices = cells.vertices
    if origin is not None:
        seeds, vertices = seeds + origin, vertices - origin[:, None, :]
        coefficients = _moved_coefficients(xp, coefficients, origin)
    kernel = lambda s, v, c, k: _polynomial_parts(xp, s, v, c, k, lo, hi, (n0, n1, nn))
    g_tables, g_mono = row_blocks.blockwise(xp, kernel, seeds, vertices, cells.count, coefficients)
    g_mono = _tables_to_monomials(xp, xp.sum(g_tables, axis=0), lo, hi, n0, n1, n) \
        + xp.reshape(xp.permute_dims(xp.reshape(xp.sum(g_mono, axis=0), (n, n, n0, n1)), (2, 3, 0, 1)), (n0, n1, nn))
    # a = M^T c M: dQ/dc = M (dQ/da) M^T
    m = change_of_basis(xp, n - 1, g_mono)
    g = xp.matmul(xp.matmul(m, xp.reshape(g_mono, (n0, n1, n, n))), xp.permute_dims(m, (1, 0)))
    return xp.reshape(g, (n0, n1, nn))


@_compat.jit_on_jax("shape")
def _polynomial_parts(xp, seeds, vertices, count, coefficients, lo, hi, shape):
    """The derivatives of :func:`bernstein_polynomial_integrals`' sum with respect to the row
    tables ``(1, 3 n, n1 (n0 + 1))`` (the layout of :func:`row_tables`) and to the monomial
    coefficients read directly ``(1, n^2, n0 n1)``, of the cells ``(vertices, count)``."""
    n0, n1, nn = shape
    n = math.isqrt(nn)
    dev = aac.device(seeds)
    rows_t = n1 * (n0 + 1)
    g_tables = xp.zeros((rows_t * 3 * n,), dtype=seeds.dtype, device=dev)
    g_mono = xp.zeros((n0 * n1 * nn,), dtype=seeds.dtype, device=dev)
    nodes, weights = gauss_legendre(n + 1)
    lines_t = xp.arange(3 * n, dtype=xp.int64, device=dev)[:, None] * rows_t
    lines_m = xp.arange(nn, dtype=xp.int64, device=dev)[:, None] * (n0 * n1)
    edges = Edges(xp, seeds, vertices, count, lo, hi, (n0, n1))
    for e in edges.groups(xp):
        grid = PieceGrid(xp, seeds, e, (n0, n1), lo, hi)
        dx, dy = grid.dx, (hi[1] - lo[1]) / n1
        sx, sy = grid.sx, xp.take(seeds[:, 1], e.cell)
        ca, cbx, cby, cc = (xp.take(coefficients[:, k], e.cell) for k in range(4))

        def visit(piece, acc):
            g_tables, g_mono = acc
            f = _PieceFrame(xp, grid, piece, dx, dy, lo, sy, nodes, weights)
            ul = f.ul
            on_tables = [[0.0] * n for _ in range(3)]       # d/dT_m[r1] at the piece's cell (+), seed's (-)
            on_mono = [[0.0] * n for _ in range(n)]         # d/da[r0, r1]
            for u, v, t0, t1, w in f.nodes:
                wd = w * f.dv
                h0, h1, h2 = wd * (ca + v * (cby + cc * v)), wd * cbx, wd * cc
                # Pre_0 = D_0, Pre_1 = D_1 - s D_0, Pre_2 = D_2 - 2 s D_1 + s^2 D_0
                eta = (h0 - sx * (h1 - sx * h2), h1 - 2.0 * sx * h2, h2)
                # the piece's own cell: sum_b lambda_b K_b
                lam = (dx * (h0 + ul * (h1 + ul * h2)), dx * dx * (h1 + 2.0 * ul * h2), dx * dx * dx * h2)
                t2 = t0 * t0
                powers = (t0, t2, t2 * t0)
                mu, t0_r = [], 1.0                           # d/da[r0, r1] = mu[r0] t1^r1
                for r0 in range(n):
                    mu.append(t0_r * sum(lam[b] * (powers[b] * (1.0 / (r0 + b + 1))) for b in range(3)))
                    t0_r = t0_r * t0
                t1_r = 1.0
                for r1 in range(n):
                    for m in range(3):
                        on_tables[m][r1] = on_tables[m][r1] + eta[m] * t1_r
                    for r0 in range(n):
                        on_mono[r0][r1] = on_mono[r0][r1] + mu[r0] * t1_r
                    t1_r = t1_r * t1
            t = xp.stack([on_tables[m][r1] for m in range(3) for r1 in range(n)])     # (3n, P)
            at = xp.concat([f.at_pixel, f.at_seed])[None, :] + lines_t
            g_tables = g_tables + _compat.segment_sum(xp, xp.reshape(xp.concat([t, -t], axis=1), (-1,)),
                                                      xp.reshape(at, (-1,)), rows_t * 3 * n)
            mono = xp.stack([on_mono[r0][r1] for r0 in range(n) for r1 in range(n)])  # (n^2, P)
            at = f.cell_index[None, :] + lines_m
            g_mono = g_mono + _compat.segment_sum(xp, xp.reshape(mono, (-1,)), xp.reshape(at, (-1,)), n0 * n1 * nn)
            return g_tables, g_mono

        g_tables, g_mono = visit_pieces(xp, e, (n0, n1), visit, (g_tables, g_mono))
    return xp.reshape(g_tables, (1, 3 * n, rows_t)), xp.reshape(g_mono, (1, nn, n0 * n1))


def _tables_to_monomials(xp, g_tables, lo, hi, n0, n1, n):
    """The monomial coefficients' share of the derivatives with respect to the row tables,
    ``(n0, n1, n^2)``: ``T_m[j, i] = sum_{k < i} band_m[k, j]`` gives
    ``dQ/dband_m[k, j] = sum_{i > k} dQ/dT_m[j, i]``, and ``band_m[k, j, r1] = sum_r0
    beta[m, k, r0] a[k, j, r0, r1]`` gives ``dQ/da[k, j, r0, r1] = sum_m beta[m, k, r0]
    dQ/dband_m[k, j, r1]``."""
    g = xp.permute_dims(xp.reshape(g_tables, (3, n, n1, n0 + 1)), (2, 3, 0, 1))             # (n1, n0 + 1, 3, n)
    after = xp.flip(xp.cumulative_sum(xp.flip(g, axis=1), axis=1), axis=1)[:, 1:, ...]   # (n1, n0, 3, n)
    beta = _band_integrals(xp, lo, hi, n0, n, g_tables)                                  # (3, n0, n)
    # out[k, j, r0, r1] = sum_m beta[m, k, r0] after[j, k, m, r1]
    after = xp.permute_dims(after, (1, 0, 2, 3))                                         # (n0, n1, 3, n)
    out = None
    for m in range(3):
        term = beta[m, :, :][:, None, :, None] * after[:, :, m:m + 1, :]
        out = term if out is None else out + term
    return xp.reshape(out, (n0, n1, n * n))
