"""Exact integrals of a Bernstein polynomial grid density over the 2D power cells.

On grid cell ``(i, j)`` of the box ``[lo, hi]`` (``n0 x n1`` cells of size ``dx x dy``,
corner ``(X_i, Y_j)``), in its own coordinates ``t0 = (x - X_i) / dx``,
``t1 = (y - Y_j) / dy``, the density is of degree ``p`` per axis:

    rho = sum_{k0, k1} c[i, j, k0, k1] B(k0, p, t0) B(k1, p, t1)
        = sum_{r0, r1} a[i, j, r0, r1] t0^r0 t1^r1,

its Bernstein coefficients ``c`` turned once per density into monomial ones ``a``
(:func:`monomial_coefficients`; ``t`` is in [0, 1] and ``p`` small, the change of basis loses
nothing that matters). As in :mod:`.contour`, an integral over a cell becomes a contour
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

The transpose of these integrals (the gradient of W2^2 with respect to the coefficients)
runs the same walk: :mod:`.bernstein_transpose`.
"""
from __future__ import annotations

import math

import array_api_compat as aac

from .. import _compat, row_blocks
from ..moments import about_seeds
from ..quadrature import change_of_basis, gauss_legendre
from .contour import Edges, far_origins, PieceGrid, visit_pieces


def degree_of(coefficients):
    """The degree ``p`` per axis of Bernstein ``coefficients`` (n0, n1, (p+1)^2)."""
    n = math.isqrt(coefficients.shape[-1])
    if n * n != coefficients.shape[-1]:
        raise ValueError(f"the last axis must hold (p+1)^2 Bernstein coefficients, got {coefficients.shape[-1]}")
    return n - 1


def monomial_coefficients(xp, coefficients):
    """``a`` (n0, n1, n, n), ``n = p + 1``: ``rho = sum a[i, j, r0, r1] t0^r0 t1^r1`` on cell
    ``(i, j)``, from the Bernstein ``coefficients`` (n0, n1, n^2): ``a = M^T c M``."""
    n0, n1, _ = coefficients.shape
    n = degree_of(coefficients) + 1
    m = change_of_basis(xp, n - 1, coefficients)
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
    flat index of its grid cell, its columns in the row tables (its cell's, the seed's), the
    cell's lower-left corner relative to the seed ``(ul, vb)``, ``dv`` and its length (zero
    where the piece is not live), and the Gauss nodes along it ``(u, v, t0, t1, weight)``."""

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
    origin = far_origins(xp, cells.vertices, cells.count)
    vertices = cells.vertices
    if origin is not None:
        seeds, vertices = seeds + origin, vertices - origin[:, None, :]
    mono = monomial_coefficients(xp, coefficients)
    tables = row_tables(xp, mono, lo, hi)
    n0, n1, n, _ = mono.shape
    by_coefficient = xp.reshape(xp.permute_dims(mono, (2, 3, 0, 1)), (n * n, n0, n1))
    split, facet = row_blocks.blockwise(
        xp, lambda s, v, c: edge_walk(xp, s, v, c, by_coefficient, tables, lo, hi), seeds, vertices, cells.count)
    return split, facet, origin


@_compat.jit_on_jax()
def edge_walk(xp, seeds, vertices, count, mono, tables, lo, hi):
    """``(mass, M_x, M_y, M_xx, M_yy)`` (n, 5) and the edge integrals (n, V) of the cells
    ``(vertices, count)`` of ``seeds``; ``mono`` (n^2, n0, n1) the monomial coefficients,
    ``tables`` their :func:`row_tables`."""
    shape = tuple(mono.shape[1:])
    edges = Edges(xp, seeds, vertices, count, lo, hi, shape)
    moments, facet = None, None
    for e in edges.groups(xp):
        m, f = edge_integrals(xp, seeds, e, mono, tables, lo, hi)
        moments, facet = (m, f) if moments is None else (moments + m, facet + f)
    return moments, facet


def edge_integrals(xp, seeds, e, mono, tables, lo, hi):
    """:func:`edge_walk` of the edges ``e``."""
    nn, n0, n1 = mono.shape
    n = math.isqrt(nn)
    shape = (n0, n1)
    grid = PieceGrid(xp, seeds, e, shape, lo, hi)
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
    acc, facet = visit_pieces(xp, e, shape, visit, ((zero,) * 5, zero))
    return xp.stack([e.per_cell(xp, a) for a in acc], axis=1), e.per_slot(xp, facet)
