"""Exact integrals of a Bernstein polynomial grid density on a line, and the inverse of its
cumulative distribution.

On grid segment ``k`` of ``[lo, hi]`` (``n0`` segments of length ``h``, left edge ``e_k``), in
its own coordinate ``t = (x - e_k) / h`` in [0, 1], the density is of degree ``p``:

    rho = sum_j c[k, j] B(j, p, t),    B(j, p, t) = C(p, j) t^j (1 - t)^(p - j),

a sum of terms of one sign (``c >= 0``), evaluated as such. On a piece ``[a, b]`` of a cell
and a segment (:func:`.integrate.pieces`), ``rho (x - y_i)^m`` (``m <= 2``) is a polynomial of
degree ``p + 2`` in ``x``: Gauss-Legendre with ``p // 2 + 2`` points integrates it exactly.
The transpose (the gradient of W2^2 with respect to the coefficients) reads the same nodes:
per segment and basis function, ``sum_i int B_j (a_i + b_i u + c_i u^2)``.

The cumulative distribution on segment ``k``, ``F_k(t) = int_0^t rho h ds`` (divided by
``h``), is a polynomial of degree ``p + 1`` whose Bernstein coefficients are the cumulative
sums of the density's divided by ``p + 1``:

    F_k(t) = sum_{j=0}^{p+1} d[k, j] B(j, p + 1, t),   d[k, j] = sum_{l < j} c[k, l] / (p + 1),

nondecreasing, strictly increasing on a segment of positive mass (``rho`` is a nonnegative
polynomial, zero at isolated points only). :func:`segment_inverse` inverts it by bisection on
[0, 1] for a fixed number of rounds, then one Newton step kept inside the final bracket.
"""
from __future__ import annotations

import math

import array_api_compat as aac

from .. import _compat
from ..quadrature import change_of_basis, gauss_legendre
from .cells import clamp
from .segments import end_moments, grid_edges, pieces

#: Bisection rounds of :func:`segment_inverse`: the bracket ends at 2^-52 (about 2.2e-16).
BISECTION_ROUNDS = 52


def bernstein_basis(xp, t, p: int):
    """``[B(j, p, t) for j in 0..p]``: each a nonnegative array of ``t``'s shape (``t`` in [0, 1])."""
    s = 1.0 - t
    up, down = [xp.ones_like(t)], [xp.ones_like(t)]
    for _ in range(p):
        up.append(up[-1] * t)
        down.append(down[-1] * s)
    return [math.comb(p, j) * (up[j] * down[p - j]) for j in range(p + 1)]


def bernstein_value(xp, rows, t):
    """``sum_j rows[j] B(j, p, t)``, ``rows`` a list of ``p + 1`` arrays (or one array (P, p + 1))."""
    rows = [rows[:, j] for j in range(rows.shape[1])] if not isinstance(rows, list) else rows
    basis = bernstein_basis(xp, t, len(rows) - 1)
    out = rows[0] * basis[0]
    for r, b in zip(rows[1:], basis[1:]):
        out = out + r * b
    return out


def _nodes(xp, seeds, cells, lo, hi, n0: int, p: int):
    """``(cell, segment, [(u, t, weight)])``: the pieces of the cells and the grid, and the Gauss
    nodes along each (``u = x - y_i``, ``t`` the segment's coordinate, ``weight`` times the
    piece's length)."""
    cell, segment, u, v, length = pieces(xp, seeds, cells, lo, hi, n0)
    h = (hi[0] - lo[0]) / n0
    left = xp.take(grid_edges(xp, lo, hi, n0), segment) - xp.take(seeds[:, 0], cell)     # e_k - y_i
    nodes, weights = gauss_legendre(p // 2 + 2)
    out = []
    for sigma, w in zip(nodes, weights):
        at = u + sigma * (v - u)
        out.append((at, clamp(xp, (at - left) / h, 0.0, 1.0), w * length))
    return cell, segment, out


@_compat.jit_on_jax()
def bernstein_cell_integrals(xp, seeds, cells, coefficients, lo, hi):
    """Per cell its mass, first moment and second moment about its seed ``(n, 3)``, and the
    density at each end ``(n, 2)``, for a Bernstein grid density.

    Parameters
    ----------
    xp : module
        Array namespace.
    seeds : array (n, 1)
        The seeds ``y_i``.
    cells : Intervals
        Their cells (:class:`.cells.Intervals`).
    coefficients : array (n0, p + 1)
        The Bernstein coefficients of each grid segment of ``[lo, hi]``.
    lo, hi : array (1,)
        The domain.

    Returns
    -------
    moments : array (n, 3)
        ``int rho``, ``int (x - y_i) rho``, ``int (x - y_i)^2 rho`` over each cell.
    facet : array (n, 2)
        The density at each end (the mean of its two sides at a grid edge), as
        :func:`.integrate.cell_integrals` (its contract for ``p = 0``).
    """
    n, (n0, q) = seeds.shape[0], coefficients.shape
    cell, segment, nodes = _nodes(xp, seeds, cells, lo, hi, n0, q - 1)
    rows = [xp.take(coefficients[:, j], segment) for j in range(q)]
    mass, first, second = 0.0, 0.0, 0.0
    for u, t, w in nodes:
        m = w * bernstein_value(xp, rows, t)
        mass, first, second = mass + m, first + m * u, second + m * (u * u)
    moments = xp.stack([_compat.segment_sum(xp, m, cell, n) for m in (mass, first, second)], axis=1)
    return moments, end_density(xp, seeds, cells, coefficients, lo, hi)


def end_density(xp, seeds, cells, coefficients, lo, hi):
    """The density at each end of the cells ``(n, 2)``: the mean of its values on the two sides
    at a grid edge (the domain's ends: the value inside), 0 for empty cells."""
    n0 = coefficients.shape[0]
    at = seeds[:, 0][:, None] + cells.vertices[:, :, 0]          # the ends, (n, 2)
    t = (at - lo[0]) * (n0 / (hi[0] - lo[0]))
    below = clamp(xp, xp.astype(xp.ceil(t), xp.int64) - 1, 0, n0 - 1)
    above = clamp(xp, xp.astype(xp.floor(t), xp.int64), 0, n0 - 1)

    def value(k):
        local = clamp(xp, t - xp.astype(k, t.dtype), 0.0, 1.0)
        return bernstein_value(xp, [_compat.flat_take(coefficients[:, j], k) for j in range(coefficients.shape[1])],
                               local)
    density = 0.5 * (value(below) + value(above))
    return xp.where((cells.count > 0)[:, None], density, 0.0)


@_compat.jit_on_jax()
def bernstein_facet_moments(xp, seeds, cells, coefficients, lo, hi):
    """Per end of each cell (its "facet", a point), the density there times ``1``, ``u`` and
    ``u^2``, ``u = x - y_i``: :func:`.integrate.facet_moments` (its contract) with the density
    of :func:`end_density`, shapes (n, 2), (n, 2, 1), (n, 2, 1, 1)."""
    return end_moments(end_density(xp, seeds, cells, coefficients, lo, hi), cells)


@_compat.jit_on_jax()
def bernstein_axis_second_moments(xp, seeds, cells, coefficients, lo, hi):
    """Per cell ``int_{L_i} (x - y_i)^2 rho``, shape (n, 1): the second moment of
    :func:`bernstein_cell_integrals`."""
    return bernstein_cell_integrals(xp, seeds, cells, coefficients, lo, hi)[0][:, 2:]


def bernstein_potential_integrals(xp, seeds, cells, psi, lo, hi, coefficient_shape):
    """Per grid segment and basis function ``sum_i int_{L_i & segment} B_j ((x - y_i)^2 - psi_i)``,
    shape ``coefficient_shape`` (n0, p + 1): the derivative of ``sum_i int_{L_i} ((x - y_i)^2 -
    psi_i) rho`` with respect to the Bernstein coefficients, the cells fixed
    (:func:`bernstein_polynomial_integrals` of ``(-psi, 0, 1)``)."""
    zero = xp.zeros_like(psi)
    coefficients = xp.stack([-psi, zero, xp.ones_like(psi)], axis=1)
    return bernstein_polynomial_integrals(xp, seeds, cells, coefficients, lo, hi, coefficient_shape)


@_compat.jit_on_jax("coefficient_shape")
def bernstein_polynomial_integrals(xp, seeds, cells, coefficients, lo, hi, coefficient_shape):
    """Per grid segment ``k`` and basis function ``j``, ``sum_i int_{L_i & k} B_j (a_i + b_i u +
    c_i u^2) dx``, ``u = x - y_i``.

    Parameters
    ----------
    xp : module
        Array namespace.
    seeds : array (n, 1)
        The seeds.
    cells : Intervals
        Their cells.
    coefficients : array (n, 3)
        ``(a_i, b_i, c_i)`` per cell.
    lo, hi : array (1,)
        The domain.
    coefficient_shape : tuple of int
        ``(n0, p + 1)``, the shape of the density's Bernstein coefficients.

    Returns
    -------
    array of shape ``coefficient_shape``
        The transpose of the moments of :func:`bernstein_cell_integrals`:
        ``sum(result * c) == sum(coefficients * moments(c))``.
    """
    n0, q = (int(s) for s in coefficient_shape)
    cell, segment, nodes = _nodes(xp, seeds, cells, lo, hi, n0, q - 1)
    a, b, c = (xp.take(coefficients[:, m], cell) for m in range(3))
    per_basis = [0.0] * q
    for u, t, w in nodes:
        phi = w * (a + u * (b + u * c))
        per_basis = [acc + phi * basis for acc, basis in zip(per_basis, bernstein_basis(xp, t, q - 1))]
    terms = xp.reshape(xp.stack(per_basis, axis=1), (-1,))                  # (P q,): segment-major
    ids = xp.reshape(segment[:, None] * q + xp.arange(q, dtype=segment.dtype, device=aac.device(segment))[None, :],
                     (-1,))
    return xp.reshape(_compat.segment_sum(xp, terms, ids, n0 * q), (n0, q))


# ------------------------------------------------------------------ the cumulative distribution
def segment_masses(xp, coefficients, lo, hi):
    """The mass of each grid segment (n0,): its length times the mean of its coefficients."""
    n0 = coefficients.shape[0]
    return xp.mean(coefficients, axis=1) * ((hi[0] - lo[0]) / n0)


def segment_inverse(xp, rows, target):
    """``t`` in [0, 1] with ``F(t) = target``, ``F = sum_j d[:, j] B(j, p + 1, t)`` the
    cumulative distribution of a segment (``rows`` (P, p + 1) its density's Bernstein
    coefficients, ``d`` their cumulative sums over ``p + 1``; ``F`` in units of the segment's
    length: ``F(1)`` is their mean).

    0 where ``target <= 0``, 1 where ``target >= F(1)`` (so 0 on a segment of zero mass); else
    :data:`BISECTION_ROUNDS` rounds of bisection on [0, 1] (``F`` nondecreasing), ``F`` in the
    monomial basis there (Horner: a few roundings off near the root, which the last step
    corrects), then a Newton step from the bracket's middle in the Bernstein basis, kept in
    the bracket.
    """
    q = rows.shape[1]
    zero = xp.zeros((rows.shape[0], 1), dtype=rows.dtype, device=aac.device(rows))
    d = xp.concat([zero, xp.cumulative_sum(rows, axis=1) / q], axis=1)          # (P, q + 1)
    mono = xp.matmul(d, change_of_basis(xp, q, rows))                        # F = sum_r mono[:, r] t^r
    power = [mono[:, r] for r in range(q + 1)]

    def bisect(_, bracket):
        a, b = bracket
        mid = 0.5 * (a + b)
        value = power[q]
        for c in reversed(power[:-1]):
            value = value * mid + c
        below = value < target
        return xp.where(below, mid, a), xp.where(below, b, mid)

    a, b = _compat.fori_loop(0, BISECTION_ROUNDS, bisect, (xp.zeros_like(target), xp.ones_like(target)))
    mid = 0.5 * (a + b)
    slope = bernstein_value(xp, rows, mid)
    step = (bernstein_value(xp, d, mid) - target) / xp.where(slope > 0, slope, 1.0)
    t = clamp(xp, xp.where(slope > 0, mid - step, mid), a, b)
    t = xp.where(target >= d[:, q], 1.0, t)
    return xp.where(target <= 0, 0.0, t)
