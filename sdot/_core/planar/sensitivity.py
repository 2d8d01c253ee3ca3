"""Integrals for the sensitivity of the plan (its implicit differentiation), in 2D.

Three integrals of a piecewise-constant grid density over the cells, by the edge walk
and the contour formulas of :mod:`.integrate` (re-exported there: the caller reaches them
as ``geometry.of_seeds(seeds).integrate.<name>``):

- :func:`facet_moments`: per edge slot, the density times ``1``, ``u`` and ``u u^T``
  integrated along the edge (``u = x - y_i``), by 2-point Gauss-Legendre on each
  pixel piece (exact: the integrand is a polynomial of degree 2 there);
- :func:`polynomial_integrals`: per pixel, the integral of a quadratic polynomial per
  cell, ``a_i + b_i . u + c_i |u|^2``: the transpose of the map from the pixel values to
  the cell moments of :func:`.integrate.cell_integrals` (what
  :func:`.integrate.potential_integrals` computes for ``a = -psi``, ``b = 0``, ``c = 1``);
- :func:`axis_second_moments`: per cell, ``int (x_a - y_ia)^2 rho`` for each axis.

A cell far from its seed (:data:`.polygons.FAR`) is integrated about its first vertex
``o``, like in :func:`.integrate.cell_integrals`, and the results moved to the seed after:
no term of size ``|o|^2`` cancels.
"""
from __future__ import annotations

import array_api_compat as aac

from .. import _compat, row_blocks
from .contour import (GAUSS, edge_walk, clamp, Edges, far_origins, PieceGrid, uniform_integrals,
                        visit_pieces, prefix_tables)
from .polygons import gather


def _about_origins(xp, seeds, cells, origin):
    """The seeds and the vertices of the cells moved to their far ``origin`` (None: as they are)."""
    if origin is None:
        return seeds, cells.vertices
    return seeds + origin, cells.vertices - origin[:, None, :]


def facet_moments(xp, seeds, cells, values, lo, hi):
    """Per edge slot of the cells, the density times ``1``, ``u`` and ``u u^T`` integrated
    along the edge, ``u = x - y_i`` (the seed of the cell).

    Parameters
    ----------
    xp : module
        Array namespace.
    seeds : array (n, 2)
        The seeds.
    cells : Cells
        Their cells (:class:`.polygons.Cells`: ``vertices`` relative to the seeds, ``count``).
    values : array (n_x, n_y)
        The pixel values of the density on the box ``[lo, hi]`` ((1, 1): uniform, in closed form).
    lo, hi : array (2,)
        The box.

    Returns
    -------
    f0 : array (n, V)
        ``int_edge rho ds`` of the edge from vertex k to vertex k + 1: the ``facet`` of
        :func:`.integrate.cell_integrals`.
    f1 : array (n, V, 2)
        ``int_edge rho u ds``.
    f2 : array (n, V, 2, 2)
        ``int_edge rho u u^T ds`` (symmetric).

    Notes
    -----
    Slots ``k >= count`` are zero. Edges on the box's sides (``labels < 0``) are integrated
    like the others (not zero): the density along the box's side, as in the ``facet`` of
    :func:`.integrate.cell_integrals`.
    """
    if tuple(values.shape) == (1, 1):
        kernel = lambda s, v, c: _uniform_facet_moments(xp, s, v, c, values, lo, hi)
    else:
        kernel = lambda s, v, c: _facet_moments(xp, s, v, c, values, lo, hi)
    return facet_moments_by(xp, kernel, seeds, cells)


def facet_moments_by(xp, kernel, seeds, cells):
    """The facet moments ``kernel(seeds, vertices, count)`` of the cells in blocks of rows,
    taken about the far cells' origins (exact far from the seeds) and moved to the seeds."""
    origin = far_origins(xp, cells.vertices, cells.count)
    seeds, vertices = _about_origins(xp, seeds, cells, origin)
    return facets_about_seeds(*row_blocks.blockwise(xp, kernel, seeds, vertices, cells.count), origin)


def facets_about_seeds(f0, f1, f2, origin):
    """Facet moments ``(f0, f1, f2)`` about the far cells' ``origin`` (n, 2) moved to the seeds
    (None: as they are): with ``u = o + w``, ``f1 = f1' + o f0`` and
    ``f2 = f2' + o f1'^T + f1' o^T + o o^T f0``."""
    if origin is None:
        return f0, f1, f2
    o = origin[:, None, :]
    f2 = (f2 + o[..., :, None] * f1[..., None, :] + f1[..., :, None] * o[..., None, :]
          + (o[..., :, None] * o[..., None, :]) * f0[..., None, None])
    return f0, f1 + o * f0[..., None], f2


def _symmetric(xp, xx, xy, yy):
    """The (..., 2, 2) matrices of entries ``xx``, ``xy``, ``yy``."""
    return xp.stack([xp.stack([xx, xy], axis=-1), xp.stack([xy, yy], axis=-1)], axis=-2)


@_compat.jit_on_jax()
def _facet_moments(xp, seeds, vertices, count, density, lo, hi):
    """:func:`facet_moments` of the cells ``(vertices, count)`` of ``seeds``, by the edge walk."""
    flat_density, ny = xp.reshape(density, (-1,)), density.shape[1]

    def visit(piece, acc):
        c = xp.where(piece.live, xp.take(flat_density, piece.ix * ny + piece.iy), 0.0)
        p, dp = piece.p, piece.q - piece.p
        f0 = c * xp.sqrt(dp[:, 0] * dp[:, 0] + dp[:, 1] * dp[:, 1])        # as the facet of cell_integrals
        ux = [p[:, 0] + tau * dp[:, 0] for tau in GAUSS]
        uy = [p[:, 1] + tau * dp[:, 1] for tau in GAUSS]
        half = 0.5 * f0
        terms = (f0, half * (ux[0] + ux[1]), half * (uy[0] + uy[1]), half * (ux[0] * ux[0] + ux[1] * ux[1]),
                 half * (ux[0] * uy[0] + ux[1] * uy[1]), half * (uy[0] * uy[0] + uy[1] * uy[1]))
        return tuple(a + t for a, t in zip(acc, terms))

    edges = Edges(xp, seeds, vertices, count, lo, hi, density.shape)
    total = None
    for e in edges.groups(xp):
        zero = xp.zeros(e.slot.shape, dtype=seeds.dtype, device=aac.device(seeds))
        acc = [e.per_slot(xp, a) for a in visit_pieces(xp, e, density.shape, visit, (zero,) * 6)]
        total = acc if total is None else [t + a for t, a in zip(total, acc)]
    f0, fx, fy, fxx, fxy, fyy = total
    return f0, xp.stack([fx, fy], axis=-1), _symmetric(xp, fxx, fxy, fyy)


@_compat.jit_on_jax()
def _uniform_facet_moments(xp, seeds, vertices, count, density, lo, hi):
    """:func:`facet_moments` for a constant density ``c``, in closed form: on the edge
    ``(a, b)`` (in the box), ``c |b - a|`` times ``1``, ``(a + b) / 2`` and
    ``(a a^T + b b^T) / 3 + (a b^T + b a^T) / 6``."""
    a, b, valid = _clamped_edges(xp, seeds, vertices, count, lo, hi)
    c = xp.reshape(density, (1,))
    d = b - a
    f0 = c * xp.where(valid, xp.sqrt(d[..., 0] * d[..., 0] + d[..., 1] * d[..., 1]), 0.0)
    f1 = f0[..., None] * (a + b) * 0.5
    ax, ay, bx, by = a[..., 0], a[..., 1], b[..., 0], b[..., 1]
    f2 = _symmetric(xp, ax * ax + ax * bx + bx * bx, ax * ay + 0.5 * (ax * by + bx * ay) + bx * by,
                    ay * ay + ay * by + by * by)
    return f0, f1, f2 * (f0 / 3.0)[..., None, None]


def _clamped_edges(xp, seeds, vertices, count, lo, hi):
    """The edges ``(a, b)`` (n, V, 2) of the cells, their vertices clamped into the box
    (as :func:`.contour.uniform_integrals` does), and which slots hold one."""
    n, cap, _ = vertices.shape
    k = xp.arange(cap, dtype=xp.int64, device=aac.device(count))[None, :]
    valid = k < count[:, None]
    low, high = lo - seeds, hi - seeds
    a = xp.stack([clamp(xp, vertices[..., i], low[:, i:i + 1], high[:, i:i + 1]) for i in range(2)], axis=-1)
    a = xp.where(valid[..., None], a, 0.0)
    nxt = (k + 1) % xp.maximum(count, 1)[:, None]
    b = xp.stack([gather(a[..., i], nxt) for i in range(2)], axis=-1)
    return a, b, valid


def _moved_coefficients(xp, coefficients, origin):
    """Coefficients ``(a, b, c)`` of a polynomial in ``u`` as ones in ``w = u - o``:
    ``a + b . o + c |o|^2``, ``b + 2 c o``, ``c``."""
    d = origin.shape[1]
    a, b, c = coefficients[:, :1], coefficients[:, 1:1 + d], coefficients[:, 1 + d:]
    a = a + _compat.dot(b, origin)[:, None] + c * _compat.dot(origin, origin)[:, None]
    return xp.concat([a, b + 2.0 * c * origin, c], axis=1)


@_compat.jit_on_jax("shape")
def polynomial_integrals(xp, seeds, cells, coefficients, lo, hi, shape):
    """Per pixel ``p``, ``sum_i int_{L_i cap p} (a_i + b_i . u + c_i |u|^2) dx``, ``u = x - y_i``.

    The transpose of the linear map from the pixel values to the cell moments of
    :func:`.integrate.cell_integrals`: ``sum(polynomial_integrals(coefficients) * values)
    == sum(coefficients * cell_integrals(values)[0])`` (moments ``(mass, M_x, M_y, M_2)``).

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
    shape : tuple of int
        The pixel grid ``(n_x, n_y)`` ((1, 1): the whole box, in closed form).

    Returns
    -------
    array of shape ``shape``
        The integrals.

    Notes
    -----
    The contour walk of :func:`.integrate.cell_integrals` transposed coefficient by
    coefficient: the pixel values it reads directly get their terms, and the prefix tables
    ``A_m`` (:func:`.integrate.prefix_tables`) get theirs, taken back to the pixels
    (``A_m[j, i] = sum_{k < i} c_kj (X_{k+1}^m - X_k^m)``) once at the end.
    """
    origin = far_origins(xp, cells.vertices, cells.count)
    seeds, vertices = _about_origins(xp, seeds, cells, origin)
    if origin is not None:
        coefficients = _moved_coefficients(xp, coefficients, origin)
    if tuple(shape) == (1, 1):
        ones = xp.ones((1, 1), dtype=seeds.dtype, device=aac.device(seeds))
        moments, _ = uniform_integrals(xp, seeds, vertices, cells.count, ones, lo, hi)
        return xp.reshape(xp.sum(coefficients * moments), (1, 1))
    kernel = lambda s, v, c, k: _polynomial_parts(xp, s, v, c, k, lo, hi, shape)
    g_tables, g_pixels = row_blocks.blockwise(xp, kernel, seeds, vertices, cells.count, coefficients)
    return _to_pixels(xp, xp.sum(g_tables, axis=0), xp.sum(g_pixels, axis=0), lo, hi, shape)


@_compat.jit_on_jax("shape")
def _polynomial_parts(xp, seeds, vertices, count, coefficients, lo, hi, shape):
    """The derivatives of :func:`polynomial_integrals`' sum with respect to the prefix
    tables ``(1, n_y (n_x + 1), 3)`` (``A_m[j, i]`` at ``[0, j (n_x + 1) + i, m - 1]``)
    and to the pixel values read directly ``(1, n_x n_y)``, of the cells ``(vertices, count)``."""
    nx, ny = shape
    dev = aac.device(seeds)
    acc = ((xp.zeros((ny * (nx + 1),), dtype=seeds.dtype, device=dev),) * 3,
           xp.zeros((nx * ny,), dtype=seeds.dtype, device=dev))
    edges = Edges(xp, seeds, vertices, count, lo, hi, shape)
    for e in edges.groups(xp):
        acc = edge_polynomial_parts(xp, seeds, e, coefficients, lo, hi, shape, acc)
    g_tables, g_pixels = acc
    return xp.stack(g_tables, axis=-1)[None, ...], g_pixels[None, :]


def edge_polynomial_parts(xp, seeds, e, coefficients, lo, hi, shape, acc):
    """``acc`` (the derivatives with respect to the prefix tables and to the pixel values,
    see :func:`_polynomial_parts`) plus those of the contour integrals along the edges ``e``."""
    grid = PieceGrid(xp, seeds, e, shape, lo, hi)
    coefficients = tuple(xp.take(coefficients[:, m], e.cell) for m in range(4))

    def visit(piece, acc):
        px, py = piece.p[:, 0], piece.p[:, 1]
        dx, dy = piece.q[:, 0] - px, piece.q[:, 1] - py
        h = xp.where(piece.live, 0.5 * dy, 0.0)
        nodes = [(px + tau * dx, py + tau * dy, h) for tau in GAUSS]
        return contour_parts(xp, grid, piece, nodes, coefficients, shape, acc)

    return visit_pieces(xp, e, shape, visit, acc)


def contour_parts(xp, grid, piece, nodes, coefficients, shape, acc):
    """``acc`` plus the derivatives of ``sum oint (a + b . u + c |u|^2)`` along the ``piece``
    (in one pixel), by the quadrature ``nodes``: ``(u, v, dv)`` (the seed-relative point and
    the weight times ``dv``) of the contour integrals of :mod:`.integrate`."""
    g_tables, g_pixels = acc
    nx, ny = shape
    a, bx, by, cc = coefficients
    half_bx, third_c = 0.5 * bx, cc / 3.0
    ul = grid.u_left(xp, piece)
    ul2 = ul * ul
    ul3 = ul2 * ul
    w0, weight, direct = 0.0, 0.0, 0.0
    for u, v, dv in nodes:
        g = (a + v * (by + cc * v)) * dv
        uu = u * u
        w0, weight = w0 + g, weight + dv
        direct = direct + g * (u - ul) + dv * (half_bx * (uu - ul2) + third_c * (uu * u - ul3))
    w1, w2 = weight * bx, weight * cc
    sx = grid.sx
    # F_0 = d_1, F_1 = d_2 / 2 - s d_1, F_2 = d_3 / 3 - s d_2 + s^2 d_1, d_m = A_m(pixel) - A_m(seed's column)
    coef = (w0 - sx * (w1 - sx * w2), 0.5 * w1 - sx * w2, w2 / 3.0)
    index = xp.concat(grid.table_index(piece))          # at the pixel (+), at the seed's column (-)
    size = ny * (nx + 1)
    g_tables = tuple(table + _compat.segment_sum(xp, xp.concat([t, -t]), index, size)
                     for table, t in zip(g_tables, coef))
    g_pixels = g_pixels + _compat.segment_sum(xp, direct, piece.ix * ny + piece.iy, nx * ny)
    return g_tables, g_pixels


def _to_pixels(xp, g_tables, g_pixels, lo, hi, shape):
    """The pixel values' share of the derivatives with respect to the prefix tables, added
    to ``g_pixels``: ``A_m[j, i] = sum_{k < i} c_kj band_m[k]`` gives
    ``dQ/dc_kj += band_m[k] sum_{i > k} dQ/dA_m[j, i]``; shape ``shape``."""
    nx, ny = shape
    xs = lo[0] + (hi[0] - lo[0]) * xp.arange(nx + 1, dtype=g_tables.dtype, device=aac.device(g_tables)) / nx
    g_tables = xp.reshape(g_tables, (ny, nx + 1, 3))
    after = xp.flip(xp.cumulative_sum(xp.flip(g_tables, axis=1), axis=1), axis=1)[:, 1:, :]   # (ny, nx, 3)
    bands = xp.stack([xs[1:] ** m - xs[:-1] ** m for m in (1, 2, 3)], axis=-1)                # (nx, 3)
    through_tables = xp.permute_dims(xp.sum(after * bands[None, :, :], axis=-1), (1, 0))        # (nx, ny)
    return xp.reshape(g_pixels, (nx, ny)) + through_tables


def axis_second_moments(xp, seeds, cells, values, lo, hi):
    """Per cell ``int_{L_i} (x_a - y_ia)^2 rho`` for each axis ``a``, shape (n, 2): the two
    parts of the second moment of :func:`.integrate.cell_integrals`.

    Parameters
    ----------
    xp : module
        Array namespace.
    seeds : array (n, 2)
        The seeds.
    cells : Cells
        Their cells (``vertices`` relative to the seeds, ``count``).
    values : array (n_x, n_y)
        The pixel values of the density on the box ``[lo, hi]`` ((1, 1): in closed form).
    lo, hi : array (2,)
        The box.

    Returns
    -------
    array (n, 2)
        ``(M_xx, M_yy)``, zero for empty cells.
    """
    origin = far_origins(xp, cells.vertices, cells.count)
    seeds, vertices = _about_origins(xp, seeds, cells, origin)
    if tuple(values.shape) == (1, 1):
        moments = row_blocks.blockwise(xp, lambda s, v, c: _uniform_axis_moments(xp, s, v, c, values, lo, hi),
                                    seeds, vertices, cells.count)
    else:
        tables = xp.reshape(prefix_tables(xp, values, lo, hi), (3, -1))
        moments = row_blocks.blockwise(xp, lambda s, v, c: edge_walk(xp, s, v, c, values, tables, lo, hi)[0],
                                    seeds, vertices, cells.count)
    mass, first, second = moments[:, :1], moments[:, 1:3], moments[:, 3:]
    if origin is None:
        return second
    return second + origin * (2.0 * first + origin * mass)       # (o + w)^2 = o^2 + 2 o w + w^2


@_compat.jit_on_jax()
def _uniform_axis_moments(xp, seeds, vertices, count, density, lo, hi):
    """``(mass, M_x, M_y, M_xx, M_yy)`` (n, 5) for a constant density ``c``, in closed form:
    with ``w = a_x b_y - a_y b_x`` on each edge ``(a, b)``, ``mass = c/2 sum w``,
    ``M_x = c/6 sum w (a_x + b_x)``, ``M_xx = c/12 sum w (a_x^2 + a_x b_x + b_x^2)``."""
    a, b, valid = _clamped_edges(xp, seeds, vertices, count, lo, hi)
    ax, ay, bx, by = a[..., 0], a[..., 1], b[..., 0], b[..., 1]
    w = xp.where(valid, ax * by - ay * bx, 0.0)
    total = lambda t: _compat.row_sum(xp, t)
    moments = [total(w) / 2.0, total(w * (ax + bx)) / 6.0, total(w * (ay + by)) / 6.0,
               total(w * (ax * (ax + bx) + bx * bx)) / 12.0, total(w * (ay * (ay + by) + by * by)) / 12.0]
    return xp.reshape(density, (1,)) * xp.stack(moments, axis=1)


@_compat.jit_on_jax("density_shape")
def potential_integrals(xp, seeds, cells, psi, lo, hi, density_shape):
    """Per pixel ``int_pixel phi``, ``phi(x) = |x - y_i|^2 - psi_i`` on cell i, shape ``density_shape``.

    The derivative of ``Q = sum_i int_{L_i} (|x - y_i|^2 - psi_i) rho`` with
    respect to each pixel value of ``rho`` (cells fixed): the transpose of the
    linear map ``rho -> Q`` of :func:`.contour.cell_integrals`, :func:`polynomial_integrals`
    of ``a = -psi``, ``b = 0``, ``c = 1``.
    """
    zero = xp.zeros_like(psi)
    coefficients = xp.stack([-psi, zero, zero, xp.ones_like(psi)], axis=1)
    return polynomial_integrals(xp, seeds, cells, coefficients, lo, hi, density_shape)
