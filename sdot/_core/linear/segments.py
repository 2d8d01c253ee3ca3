"""Exact integrals of a piecewise-constant density on a 1D grid over intervals.

The cells' ends and the grid's edges, sorted together, cut the domain into at most
``n + n0`` pieces, each inside one cell and one grid segment (:func:`pieces`): on a piece
``[p, q]`` of cell i and segment k, with ``u = p - y_i``, ``v = q - y_i``,

    int rho            = c_k (q - p),
    int rho (x - y_i)  = c_k (q - p) (u + v) / 2,
    int rho (x - y_i)^2 = c_k (q - p) (u^2 + u v + v^2) / 3,

sums of terms of one sign (no prefix table whose differences cancel), summed per cell
by a scatter-add. Static shapes: one sort of ``n + n0 + 1`` numbers. The same pieces give
the per-segment integrals of a quadratic per cell (:func:`polynomial_integrals`, the
transpose of the moments); the ends of the cells their facet moments (:func:`facet_moments`).
"""
from __future__ import annotations

import array_api_compat as aac

from .. import _compat
from .cells import clamp, live_order


def grid_edges(xp, lo, hi, n0: int):
    """The ``n0 + 1`` edges of the grid's segments over ``[lo, hi]`` (shape (1,) each),
    the last one exactly ``hi``."""
    k = xp.arange(n0 + 1, dtype=lo.dtype, device=aac.device(lo))
    edges = lo[0] + (hi[0] - lo[0]) * (k / n0)
    return xp.where(k == n0, hi[0], edges)


def pieces(xp, seeds, cells, lo, hi, n0: int):
    """``(cell, segment, u, v, length)`` of every piece (n + n0,): the cell and the grid
    segment it lies in, its ends relative to the cell's seed, its length (0 for the
    pieces of zero length, or outside the domain)."""
    n = seeds.shape[0]
    dev = aac.device(seeds)
    y = seeds[:, 0]
    order, _, n_live = live_order(xp, y, cells.count > 0)
    right = xp.where(cells.count > 0, y + cells.vertices[:, 1, 0], hi[0])
    z = xp.concat([xp.take(right, order), grid_edges(xp, lo, hi, n0)])
    kind = xp.concat([xp.ones((n,), dtype=xp.int64, device=dev), xp.zeros((n0 + 1,), dtype=xp.int64, device=dev)])
    perm = xp.argsort(z, stable=True)
    z, kind = xp.take(z, perm), xp.take(kind, perm)
    ends_passed = xp.cumulative_sum(kind)[:-1]                  # cell ends up to the piece's start
    edges_passed = xp.cumulative_sum(1 - kind)[:-1]
    rank = clamp(xp, ends_passed, 0, xp.maximum(n_live - 1, 0))
    cell = xp.take(order, rank)
    segment = clamp(xp, edges_passed - 1, 0, n0 - 1)
    p, q = clamp(xp, z[:-1], lo[0], hi[0]), clamp(xp, z[1:], lo[0], hi[0])
    at = xp.take(y, cell)
    return cell, segment, p - at, q - at, q - p


@_compat.jit_on_jax()
def cell_integrals(xp, seeds, cells, values, lo, hi):
    """``(moments, facet)``: per cell its mass, first moment and second moment about its
    seed ``(n, 3)``, and the density at each end ``(n, 2)`` (the mean of its two sides at a
    grid edge; the facet integral of a point), for the density ``values`` (n0,) on
    ``[lo, hi]``."""
    n, n0 = seeds.shape[0], values.shape[0]
    cell, segment, u, v, length = pieces(xp, seeds, cells, lo, hi, n0)
    mass = xp.take(values, segment) * length
    first = mass * (u + v) * 0.5
    second = mass * (u * u + u * v + v * v) / 3.0
    moments = xp.stack([_compat.segment_sum(xp, m, cell, n) for m in (mass, first, second)], axis=1)
    return moments, end_density(xp, seeds, cells, values, lo, hi)


def end_density(xp, seeds, cells, values, lo, hi):
    """The density at each end of the cells ``(n, 2)``: the mean of the values on its two
    sides at a grid edge (the domain's ends: the value inside), 0 for empty cells."""
    n0 = values.shape[0]
    at = seeds[:, 0][:, None] + cells.vertices[:, :, 0]          # the ends, (n, 2)
    t = (at - lo[0]) * (n0 / (hi[0] - lo[0]))
    below = clamp(xp, xp.astype(xp.ceil(t), xp.int64) - 1, 0, n0 - 1)
    above = clamp(xp, xp.astype(xp.floor(t), xp.int64), 0, n0 - 1)
    density = 0.5 * (_compat.flat_take(values, below) + _compat.flat_take(values, above))
    return xp.where((cells.count > 0)[:, None], density, 0.0)


@_compat.jit_on_jax("shape")
def potential_integrals(xp, seeds, cells, psi, lo, hi, shape):
    """Per grid segment ``int phi``, ``phi(x) = (x - y_i)^2 - psi_i`` on cell i, of ``shape``
    ``(n0,)``: the derivative of ``sum_i int_{L_i} ((x - y_i)^2 - psi_i) rho`` with respect to
    each value of ``rho``, the cells fixed (:func:`polynomial_integrals` of ``(-psi, 0, 1)``)."""
    zero = xp.zeros_like(psi)
    return polynomial_integrals(xp, seeds, cells, xp.stack([-psi, zero, xp.ones_like(psi)], axis=1), lo, hi, shape)


@_compat.jit_on_jax("shape")
def polynomial_integrals(xp, seeds, cells, coefficients, lo, hi, shape):
    """Per grid segment ``k``, ``sum_i int_{L_i cap k} (a_i + b_i u + c_i u^2) dx``, ``u = x - y_i``.

    The transpose of the map from the segment values to the moments of
    :func:`cell_integrals`: ``sum(polynomial_integrals(coefficients) * values) ==
    sum(coefficients * cell_integrals(values)[0])``.

    Parameters
    ----------
    xp : module
        Array namespace.
    seeds : array (n, 1)
        The seeds.
    cells : Intervals
        Their cells (:class:`.cells.Intervals`).
    coefficients : array (n, 3)
        ``(a_i, b_i, c_i)`` per cell.
    lo, hi : array (1,)
        The domain.
    shape : tuple of int
        ``(n0,)``, the grid's segments.

    Returns
    -------
    array (n0,)
        The integrals.
    """
    (n0,) = shape
    cell, segment, u, v, length = pieces(xp, seeds, cells, lo, hi, n0)
    a, b, c = (xp.take(coefficients[:, m], cell) for m in range(3))
    terms = length * (a + b * (u + v) * 0.5 + c * (u * u + u * v + v * v) / 3.0)
    return _compat.segment_sum(xp, terms, segment, n0)


@_compat.jit_on_jax()
def facet_moments(xp, seeds, cells, values, lo, hi):
    """Per end of each cell (its "facet", a point), the density there times ``1``, ``u`` and
    ``u^2``, ``u = x - y_i`` the end relative to the seed.

    Parameters
    ----------
    xp : module
        Array namespace.
    seeds : array (n, 1)
        The seeds.
    cells : Intervals
        Their cells (``vertices`` (n, 2, 1): left and right ends relative to the seeds).
    values : array (n0,)
        The segment values of the density on ``[lo, hi]``.
    lo, hi : array (1,)
        The domain.

    Returns
    -------
    f0 : array (n, 2)
        The density at each end: the ``facet`` of :func:`cell_integrals` (the mean of the
        values on its two sides when the end is on a grid edge, else the value of the
        segment that holds it, on the cell's own side as well).
    f1 : array (n, 2, 1)
        ``f0 u``.
    f2 : array (n, 2, 1, 1)
        ``f0 u^2``.

    Notes
    -----
    Empty cells are zero. The ends on the domain's ends (``labels < 0``) are not zero: the
    density inside the domain there, as in :func:`cell_integrals`.
    """
    return end_moments(end_density(xp, seeds, cells, values, lo, hi), cells)


def end_moments(f0, cells):
    """``(f0, f0 u, f0 u^2)`` (shapes (n, 2), (n, 2, 1), (n, 2, 1, 1)) for the density ``f0`` at
    the ends ``u`` of the cells (relative to the seeds)."""
    u = cells.vertices
    f1 = f0[:, :, None] * u
    return f0, f1, (f1 * u)[..., None]


@_compat.jit_on_jax()
def axis_second_moments(xp, seeds, cells, values, lo, hi):
    """Per cell ``int_{L_i} (x - y_i)^2 rho``, shape (n, 1): the second moment of
    :func:`cell_integrals` (one axis)."""
    return cell_integrals(xp, seeds, cells, values, lo, hi)[0][:, 2:]
