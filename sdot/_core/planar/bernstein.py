"""Exact integrals of a Bernstein polynomial grid density over the 2D power cells.

On grid cell ``(i, j)`` of the box ``[lo, hi]`` (``n0 x n1`` cells of size ``dx x dy``,
corner ``(X_i, Y_j)``), in its own coordinates ``t0 = (x - X_i) / dx``,
``t1 = (y - Y_j) / dy``, the density is of degree ``p`` per axis:

    rho = sum_{k0, k1} c[i, j, k0, k1] B(k0, p, t0) B(k1, p, t1)
        = sum_{r0, r1} a[i, j, r0, r1] t0^r0 t1^r1,

its Bernstein coefficients ``c`` turned once per density into monomial ones ``a``
(:func:`monomial_coefficients`; ``t`` is in [0, 1] and ``p`` small, the change of basis loses
nothing that matters). As in :mod:`.integrate`, an integral over a cell becomes a contour
integral, ``int_P rho f = oint F dv`` with ``F(x, y) = int_{X_b}^x rho(s, y) f(s, y) ds``, in
coordinates ``u = x - s_x``, ``v = y - s_y`` relative to the seed ``s``; the base ``X_b`` is
the left side of the seed's grid column, and the edges are split at every grid line, so that
each piece lies in one grid cell. For ``f = u^a v^b`` (``a + b <= 2``), ``F = v^b F_a`` with

    F_a = sum_r1 t1^r1 Pre_a[r1] + dx sum_b binom(a, b) U^(a-b) dx^b K_b,
    K_b = sum_{r0, r1} a[r0, r1] t1^r1 t0^(r0+b+1) / (r0 + b + 1),

``U = X_i - s_x``: the whole grid cells between the base and the piece's cell in its row,
through the row prefix tables ``T_m[j, i, r1] = sum_{k<i} sum_r0 a[k, j, r0, r1]
int_{X_k}^{X_k+1} t0^r0 s^m ds`` (:func:`row_tables`) and the seed's binomials,
``Pre_a = sum_m binom(a, m) (-s_x)^(a-m) (T_m[j, i] - T_m[j, col(s)])``, and the piece's own
cell from its left side, in that cell's coordinates. Along a piece ``x`` and ``y`` are affine,
``F`` is a polynomial of degree ``2p + 3`` at most: Gauss-Legendre with ``p + 2`` points is
exact. The density along the facets (the Newton matrix) is of degree ``2p`` there.

The transpose (:func:`bernstein_polynomial_integrals`, the gradient of W2^2 with respect to
the coefficients) runs the same walk and takes each term back to the ``a`` it reads (the
piece's cell directly, the prefix tables by a reverse cumulative sum along the rows), then
to ``c`` by the transposed change of basis.
"""
from __future__ import annotations

import functools
import math

import array_api_compat as aac

from .. import _compat
from ..moments import about_seeds
from .integrate import _Edges, _far_origins, _Grid, _visit_pieces
from .sensitivity import _moved_coefficients


@functools.lru_cache(maxsize=None)
def gauss_legendre(n: int):
    """Nodes and weights of the ``n``-point Gauss-Legendre rule on [0, 1] (exact up to degree
    ``2n - 1``), as Python floats: Newton's method on the Legendre polynomial ``P_n``."""
    nodes, weights = [], []
    for k in range(n):
        x = math.cos(math.pi * (k + 0.75) / (n + 0.5))
        for _ in range(100):
            p0, p1 = 1.0, x                   # P_0, P_1, then up to P_n by Bonnet's recursion
            for m in range(2, n + 1):
                p0, p1 = p1, ((2 * m - 1) * x * p1 - (m - 1) * p0) / m
            dp = n * (x * p1 - p0) / (x * x - 1.0) if n > 1 else 1.0
            step = p1 / dp
            x -= step
            if abs(step) < 1e-16:
                break
        nodes.append(0.5 * (1.0 - x))
        weights.append(1.0 / ((1.0 - x * x) * dp * dp))
    return tuple(nodes), tuple(weights)


@functools.lru_cache(maxsize=None)
def bernstein_to_monomial(p: int):
    """``M[k][r]``: ``B(k, p, t) = sum_r M[k][r] t^r`` (integers)."""
    return tuple(tuple(math.comb(p, k) * math.comb(p - k, r - k) * (-1) ** (r - k) if r >= k else 0
                       for r in range(p + 1)) for k in range(p + 1))


def degree_of(coefficients):
    """The degree ``p`` per axis of Bernstein ``coefficients`` (n0, n1, (p+1)^2)."""
    n = math.isqrt(coefficients.shape[-1])
    if n * n != coefficients.shape[-1]:
        raise ValueError(f"the last axis must hold (p+1)^2 Bernstein coefficients, got {coefficients.shape[-1]}")
    return n - 1


def _change_of_basis(xp, p, like):
    """:func:`bernstein_to_monomial` as an array of ``like``'s dtype and device."""
    return xp.asarray(bernstein_to_monomial(p), dtype=like.dtype, device=aac.device(like))


def monomial_coefficients(xp, coefficients):
    """``a`` (n0, n1, n, n), ``n = p + 1``: ``rho = sum a[i, j, r0, r1] t0^r0 t1^r1`` on cell
    ``(i, j)``, from the Bernstein ``coefficients`` (n0, n1, n^2): ``a = M^T c M``."""
    n0, n1, _ = coefficients.shape
    n = degree_of(coefficients) + 1
    m = _change_of_basis(xp, n - 1, coefficients)
    c = xp.reshape(coefficients, (n0, n1, n, n))
    return xp.matmul(xp.matmul(xp.permute_dims(m, (1, 0)), c), m)


def _band_integrals(xp, lo, hi, n0, n, like):
    """``beta[m, k, r0] = int_{X_k}^{X_k+1} t0^r0 s^m ds`` (3, n0, n) for ``m = 0, 1, 2``:
    ``dx sum_b binom(m, b) X_k^(m-b) dx^b / (r0 + b + 1)``."""
    dev = aac.device(like)
    dx = (hi[0] - lo[0]) / n0
    xs = lo[0] + dx * xp.arange(n0, dtype=like.dtype, device=dev)            # X_k
    r = xp.arange(n, dtype=like.dtype, device=dev)
    inv = [1.0 / (r + (b + 1.0)) for b in range(3)]                          # 1 / (r0 + b + 1)
    x = xs[:, None]
    beta0 = xp.broadcast_to(dx * inv[0][None, :], (n0, n))
    beta1 = dx * (x * inv[0][None, :] + dx * inv[1][None, :])
    beta2 = dx * (x * x * inv[0][None, :] + 2.0 * x * dx * inv[1][None, :] + dx * dx * inv[2][None, :])
    return xp.stack([beta0, beta1, beta2])


def row_tables(xp, mono, lo, hi):
    """The row prefix tables ``(3 n, n1 (n0 + 1))``: at row ``m n + r1``, column ``j (n0 + 1) + i``,
    ``T_m[j, i, r1] = sum_{k < i} sum_r0 a[k, j, r0, r1] beta[m, k, r0]`` (:func:`_band_integrals`),
    for the monomial coefficients ``mono`` (n0, n1, n, n). (A row per coefficient: the walk gathers
    each as a contiguous array, several times faster on NumPy than strided columns.)"""
    n0, n1, n, _ = mono.shape
    beta = _band_integrals(xp, lo, hi, n0, n, mono)                          # (3, n0, n)
    # band[m, j, k, r1] = sum_r0 beta[m, k, r0] a[k, j, r0, r1]
    bands = [xp.permute_dims(xp.sum(beta[m, :, :][:, None, :, None] * mono, axis=2), (1, 0, 2)) for m in range(3)]
    band = xp.stack(bands)                                                   # (3, n1, n0, n)
    zero = xp.zeros((3, n1, 1, n), dtype=mono.dtype, device=aac.device(mono))
    tables = xp.concat([zero, xp.cumulative_sum(band, axis=2)], axis=2)      # (3, n1, n0 + 1, n)
    return xp.reshape(xp.permute_dims(tables, (0, 3, 1, 2)), (3 * n, n1 * (n0 + 1)))


def _horner(coefficients, t):
    """``sum_r coefficients[r] t^r`` (a list of arrays or numbers, lowest degree first)."""
    out = coefficients[-1]
    for c in reversed(coefficients[:-1]):
        out = out * t + c
    return out


def _clamp01(xp, t):
    return xp.minimum(xp.maximum(t, 0.0), 1.0)


class _PieceFrame:
    """What the walk reads of one piece, the same for the moments and their transpose: the
    grid cell's monomial coefficients' flat index, the piece's prefix-table rows, its corner
    relative to the seed ``(U, V)``, the seed's abscissa, and the Gauss nodes along it
    ``(u, v, t0, t1)`` with their weights times ``dv`` (zero where the piece is not live)."""

    def __init__(self, xp, grid, piece, dx, dy, lo, seed_y, nodes, weights):
        self.cell_index = piece.ix * grid.shape[1] + piece.iy
        self.at_pixel, self.at_seed = grid.table_index(piece)
        self.ul = grid.u_left(xp, piece)
        self.vb = lo[1] + dy * xp.astype(piece.iy, dy.dtype) - seed_y
        p, q = piece.p, piece.q
        du, dv = q[:, 0] - p[:, 0], q[:, 1] - p[:, 1]
        self.dv = xp.where(piece.live, dv, 0.0)
        self.length = xp.where(piece.live, xp.sqrt(du * du + dv * dv), 0.0)
        self.nodes = []
        for sigma, w in zip(nodes, weights):
            u, v = p[:, 0] + sigma * du, p[:, 1] + sigma * dv
            t0 = _clamp01(xp, (u - self.ul) / dx)
            t1 = _clamp01(xp, (v - self.vb) / dy)
            self.nodes.append((u, v, t0, t1, w))


def _k_integrals(rows, t0, n):
    """``K_b = sum_r0 rows[r0] t0^(r0+b+1) / (r0+b+1)`` for ``b = 0, 1, 2`` (``rows[r0]``:
    the coefficient of ``t0^r0`` of the density at the node)."""
    t2 = t0 * t0
    powers = (t0, t2, t2 * t0)
    return [powers[b] * _horner([rows[r] * (1.0 / (r + b + 1)) for r in range(n)], t0) for b in range(3)]


def bernstein_cell_integrals(xp, seeds, cells, coefficients, lo, hi):
    """Per cell ``(mass, M_x, M_y, M_2)`` about the seed ``(n, 4)``, and per edge slot the
    density integrated along the edge ``(n, V)``, for a Bernstein grid density.

    Parameters
    ----------
    xp : module
        Array namespace.
    seeds : array (n, 2)
        The seeds ``y_i``.
    cells : Cells
        Their cells (:class:`.polygons.Cells`: ``vertices`` relative to the seeds, ``count``).
    coefficients : array (n0, n1, (p+1)^2)
        The Bernstein coefficients of each grid cell of the box (C order: ``k0 (p+1) + k1``).
    lo, hi : array (2,)
        The box.

    Returns
    -------
    moments : array (n, 4)
        ``int rho``, ``int (x - y_i) rho`` (two columns), ``int |x - y_i|^2 rho`` over each cell.
    facet : array (n, V)
        ``int rho ds`` along the edge from vertex k to vertex k + 1 (the Newton matrix's terms).

    Notes
    -----
    The contract of :func:`.integrate.cell_integrals` (the same for ``p = 0``, which
    :class:`..density.PixelDensity` computes there), by the walk of the module docstring;
    a cell far from its seed is integrated about its first vertex (:func:`..moments.about_seeds`).
    """
    split, facet, origin = _split_integrals(xp, seeds, cells, coefficients, lo, hi)
    moments = xp.concat([split[:, :3], split[:, 3:4] + split[:, 4:]], axis=1)
    return (moments if origin is None else about_seeds(xp, moments, origin)), facet


def bernstein_axis_second_moments(xp, seeds, cells, coefficients, lo, hi):
    """Per cell ``int (x_a - y_ia)^2 rho`` for each axis, (n, 2): the parts of ``M_2``."""
    split, _, origin = _split_integrals(xp, seeds, cells, coefficients, lo, hi)
    mass, first, second = split[:, :1], split[:, 1:3], split[:, 3:]
    return second if origin is None else second + origin * (2.0 * first + origin * mass)


def _split_integrals(xp, seeds, cells, coefficients, lo, hi):
    """``(mass, M_x, M_y, M_xx, M_yy)`` (n, 5) about the seeds or the far cells' origins, the
    edge integrals (n, V), and those origins (None: none)."""
    origin = _far_origins(xp, cells.vertices, cells.count)
    vertices = cells.vertices
    if origin is not None:
        seeds, vertices = seeds + origin, vertices - origin[:, None, :]
    mono = monomial_coefficients(xp, coefficients)
    tables = row_tables(xp, mono, lo, hi)
    n0, n1, n, _ = mono.shape
    by_coefficient = xp.reshape(xp.permute_dims(mono, (2, 3, 0, 1)), (n * n, n0, n1))
    split, facet = _compat.blockwise(
        xp, lambda s, v, c: _cell_integrals(xp, s, v, c, by_coefficient, tables, lo, hi), seeds, vertices, cells.count)
    return split, facet, origin


@_compat.jit_on_jax()
def _cell_integrals(xp, seeds, vertices, count, mono, tables, lo, hi):
    """``(mass, M_x, M_y, M_xx, M_yy)`` (n, 5) and the edge integrals (n, V) of the cells
    ``(vertices, count)`` of ``seeds``; ``mono`` (n^2, n0, n1) the monomial coefficients,
    ``tables`` their :func:`row_tables`."""
    shape = tuple(mono.shape[1:])
    edges = _Edges(xp, seeds, vertices, count, lo, hi, shape)
    moments, facet = None, None
    for e in edges.groups(xp):
        m, f = _edge_integrals(xp, seeds, e, mono, tables, lo, hi)
        moments, facet = (m, f) if moments is None else (moments + m, facet + f)
    return moments, facet


def _edge_integrals(xp, seeds, e, mono, tables, lo, hi):
    """:func:`_cell_integrals` of the edges ``e``."""
    nn, n0, n1 = mono.shape
    n = math.isqrt(nn)
    shape = (n0, n1)
    grid = _Grid(xp, seeds, e, shape, lo, hi)
    dx, dy = grid.dx, (hi[1] - lo[1]) / n1
    sx, sy = grid.sx, xp.take(seeds[:, 1], e.cell)
    flat = xp.reshape(mono, (nn, n0 * n1))
    nodes, weights = gauss_legendre(n + 1)

    def visit(piece, acc):
        moments, facet = acc
        f = _PieceFrame(xp, grid, piece, dx, dy, lo, sy, nodes, weights)
        d = xp.take(tables, f.at_pixel, axis=1) - xp.take(tables, f.at_seed, axis=1)     # (3n, P)
        a = xp.take(flat, f.cell_index, axis=1)                                       # (n^2, P)
        d0, d1, d2 = ([d[m * n + r, :] for r in range(n)] for m in range(3))
        pre = (d0, [d1[r] - sx * d0[r] for r in range(n)],
               [d2[r] - sx * (2.0 * d1[r] - sx * d0[r]) for r in range(n)])
        ul = f.ul
        mass, mx, my, mxx, myy = moments
        along = None
        for u, v, t0, t1, w in f.nodes:
            rows = [_horner([a[r0 * n + r1, :] for r1 in range(n)], t1) for r0 in range(n)]
            k0, k1, k2 = _k_integrals(rows, t0, n)
            f0 = _horner(pre[0], t1) + dx * k0
            f1 = _horner(pre[1], t1) + dx * (ul * k0 + dx * k1)
            f2 = _horner(pre[2], t1) + dx * (ul * (ul * k0 + 2.0 * dx * k1) + dx * dx * k2)
            wd = w * f.dv
            g0 = wd * f0
            mass, my, myy = mass + g0, my + v * g0, myy + v * v * g0
            mx, mxx = mx + wd * f1, mxx + wd * f2
            rho = w * _horner(rows, t0)
            along = rho if along is None else along + rho
        return (mass, mx, my, mxx, myy), facet + along * f.length

    zero = xp.zeros(e.slot.shape, dtype=seeds.dtype, device=aac.device(seeds))
    acc, facet = _visit_pieces(xp, e, shape, visit, ((zero,) * 5, zero))
    return xp.stack([e.per_cell(xp, a) for a in acc], axis=1), e.per_slot(xp, facet)


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
    origin = _far_origins(xp, cells.vertices, cells.count)
    vertices = cells.vertices
    if origin is not None:
        seeds, vertices = seeds + origin, vertices - origin[:, None, :]
        coefficients = _moved_coefficients(xp, coefficients, origin)
    kernel = lambda s, v, c, k: _polynomial_parts(xp, s, v, c, k, lo, hi, (n0, n1, nn))
    g_tables, g_mono = _compat.blockwise(xp, kernel, seeds, vertices, cells.count, coefficients)
    g_mono = _tables_to_monomials(xp, xp.sum(g_tables, axis=0), lo, hi, n0, n1, n) \
        + xp.reshape(xp.permute_dims(xp.reshape(xp.sum(g_mono, axis=0), (n, n, n0, n1)), (2, 3, 0, 1)), (n0, n1, nn))
    # a = M^T c M: dQ/dc = M (dQ/da) M^T
    m = _change_of_basis(xp, n - 1, g_mono)
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
    edges = _Edges(xp, seeds, vertices, count, lo, hi, (n0, n1))
    for e in edges.groups(xp):
        grid = _Grid(xp, seeds, e, (n0, n1), lo, hi)
        dx, dy = grid.dx, (hi[1] - lo[1]) / n1
        sx, sy = grid.sx, xp.take(seeds[:, 1], e.cell)
        ca, cbx, cby, cc = (xp.take(coefficients[:, k], e.cell) for k in range(4))

        def visit(piece, acc):
            g_tables, g_mono = acc
            f = _PieceFrame(xp, grid, piece, dx, dy, lo, sy, nodes, weights)
            ul = f.ul
            on_tables = [[None] * n for _ in range(3)]      # d/dT_m[r1] at the piece's cell (+), seed's (-)
            on_mono = [[None] * n for _ in range(n)]        # d/da[r0, r1]
            for u, v, t0, t1, w in f.nodes:
                wd = w * f.dv
                h0, h1, h2 = wd * (ca + v * (cby + cc * v)), wd * cbx, wd * cc
                # Pre_0 = D_0, Pre_1 = D_1 - s D_0, Pre_2 = D_2 - 2 s D_1 + s^2 D_0
                eta = (h0 - sx * (h1 - sx * h2), h1 - 2.0 * sx * h2, h2)
                # the piece's own cell: sum_b lambda_b K_b
                lam = (dx * (h0 + ul * (h1 + ul * h2)), dx * dx * (h1 + 2.0 * ul * h2), dx * dx * dx * h2)
                t2 = t0 * t0
                powers = (t0, t2, t2 * t0)
                t0_r = None                                  # t0^r0
                mu = []                                      # d/da[r0, r1] = mu[r0] t1^r1
                for r0 in range(n):
                    k = sum(lam[b] * (powers[b] * (1.0 / (r0 + b + 1))) for b in range(3))
                    mu.append(k if t0_r is None else k * t0_r)
                    t0_r = t0 if t0_r is None else t0_r * t0
                t1_r = None                                  # t1^r1
                for r1 in range(n):
                    for m in range(3):
                        term = eta[m] if t1_r is None else eta[m] * t1_r
                        on_tables[m][r1] = term if on_tables[m][r1] is None else on_tables[m][r1] + term
                    for r0 in range(n):
                        term = mu[r0] if t1_r is None else mu[r0] * t1_r
                        on_mono[r0][r1] = term if on_mono[r0][r1] is None else on_mono[r0][r1] + term
                    t1_r = t1 if t1_r is None else t1_r * t1
            t = xp.stack([on_tables[m][r1] for m in range(3) for r1 in range(n)])     # (3n, P)
            at = xp.concat([f.at_pixel, f.at_seed])[None, :] + lines_t
            g_tables = g_tables + _compat.segment_sum(xp, xp.reshape(xp.concat([t, -t], axis=1), (-1,)),
                                                      xp.reshape(at, (-1,)), rows_t * 3 * n)
            mono = xp.stack([on_mono[r0][r1] for r0 in range(n) for r1 in range(n)])  # (n^2, P)
            at = f.cell_index[None, :] + lines_m
            g_mono = g_mono + _compat.segment_sum(xp, xp.reshape(mono, (-1,)), xp.reshape(at, (-1,)), n0 * n1 * nn)
            return g_tables, g_mono

        g_tables, g_mono = _visit_pieces(xp, e, (n0, n1), visit, (g_tables, g_mono))
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
