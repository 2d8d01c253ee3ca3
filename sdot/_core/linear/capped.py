"""Exact integrals of a 1D grid density over cells cut by balls (partial transport,
:mod:`..partial`): the interval ``[y + a, y + b]`` of a cell cut by ``[y - r, y + r]``,
``r = sqrt(psi)``, split at the grid's edges into pieces where the density is a constant or
a Bernstein polynomial of degree ``p`` (``values`` (n0,) or (n0, p + 1)), integrated in closed
form or by Gauss-Legendre nodes exact for its degree plus 2.
"""
from __future__ import annotations

import array_api_compat as aac

from .. import _compat
from ..quadrature import gauss_legendre
from .bernstein import bernstein_basis, end_density as bernstein_end_density
from .cells import clamp
from .segments import end_density


def _cut(xp, cells, psi):
    """``(a, b, radius, live)``: each cell's interval cut by its ball, relative to the seed."""
    radius = xp.sqrt(xp.maximum(psi, 0.0))
    a = xp.maximum(cells.vertices[:, 0, 0], -radius)
    b = xp.minimum(cells.vertices[:, 1, 0], radius)
    return a, b, radius, (cells.count > 0) & (radius > 0) & (b > a)


def _pieces(xp, seeds, a, b, live, lo, hi, n0):
    """``(cell, segment, u, v)`` of the pieces of the cut intervals in the grid's segments
    (ends relative to the seeds). Eager (their number depends on the data)."""
    dev = aac.device(seeds)
    y = seeds[:, 0]
    h = (hi[0] - lo[0]) / n0
    first = clamp(xp, xp.astype(xp.floor((y + a - lo[0]) / h), xp.int64), 0, n0 - 1)
    last = clamp(xp, xp.astype(xp.floor((y + b - lo[0]) / h), xp.int64), 0, n0 - 1)
    counts = xp.where(live, last - first + 1, 0)
    total = _compat.to_int(xp.sum(counts))
    cell = xp.repeat(xp.arange(y.shape[0], dtype=xp.int64, device=dev), counts)
    rank = xp.arange(total, dtype=xp.int64, device=dev) - xp.take(xp.cumulative_sum(counts) - counts, cell)
    segment = xp.take(first, cell) + rank
    edge = lo[0] + h * xp.astype(segment, y.dtype)
    at = xp.take(y, cell)
    u = xp.maximum(edge - at, xp.take(a, cell))
    v = xp.minimum(edge + h - at, xp.take(b, cell))
    return cell, segment, u, xp.maximum(v, u)


def _nodes(xp, seeds, cell, segment, u, v, lo, hi, n0, p):
    """``[(x, t, weight)]``: the Gauss nodes along each piece, exact for degree ``p + 2`` (``x``
    relative to the seed, ``t`` the segment's coordinate, ``weight`` times the piece's length)."""
    h = (hi[0] - lo[0]) / n0
    left = lo[0] + h * xp.astype(segment, seeds.dtype) - xp.take(seeds[:, 0], cell)      # e_k - y_i
    nodes, weights = gauss_legendre(p // 2 + 2)
    return [(u + s * (v - u), clamp(xp, (u + s * (v - u) - left) / h, 0.0, 1.0), w * (v - u))
            for s, w in zip(nodes, weights)]


def capped_integrals(xp, seeds, cells, psi, values, lo, hi):
    """Per cell ``(mass, first, second)`` about the seed of its interval cut by its ball (n, 3),
    per end the density there if it bounds the cut interval (the facet's integral, (n, 2)), and
    per cell the density at the ball's ends that bound it (n,). Eager."""
    n, n0 = seeds.shape[0], values.shape[0]
    a, b, radius, live = _cut(xp, cells, psi)
    cell, segment, u, v = _pieces(xp, seeds, a, b, live, lo, hi, n0)
    if values.ndim == 1:
        c = xp.take(values, segment)
        parts = (c * (v - u), c * (v * v - u * u) / 2.0, c * (v * v * v - u * u * u) / 3.0)
        at_ends = end_density
    else:
        rows = xp.take(values, segment, axis=0)
        parts = (0.0, 0.0, 0.0)
        for x, t, w in _nodes(xp, seeds, cell, segment, u, v, lo, hi, n0, values.shape[1] - 1):
            basis = bernstein_basis(xp, t, values.shape[1] - 1)
            m = w * sum(rows[:, j] * basis[j] for j in range(values.shape[1]))
            parts = (parts[0] + m, parts[1] + m * x, parts[2] + m * (x * x))
        at_ends = bernstein_end_density
    moments = xp.stack([_compat.segment_sum(xp, p, cell, n) for p in parts], axis=1)
    ends = cells.vertices[:, :, 0]
    inside = live[:, None] & (xp.abs(ends) < radius[:, None])
    facet = xp.where(inside, at_ends(xp, seeds, cells, values, lo, hi), 0.0)
    balls = cells._replace(vertices=xp.stack([-radius, radius], axis=1)[:, :, None])
    at_balls = at_ends(xp, seeds, balls, values, lo, hi)
    bounds = xp.stack([-radius > ends[:, 0], radius < ends[:, 1]], axis=1) & live[:, None]
    return moments, facet, xp.sum(xp.where(bounds, at_balls, 0.0), axis=1)


def capped_polynomial_integrals(xp, seeds, cells, psi, coefficients, lo, hi, shape):
    """Per grid segment (and Bernstein basis function, for ``shape`` (n0, p + 1)) ``sum_i int (a_i
    + b_i u + c_i u^2)`` over the cut intervals (``u = x - y_i``, ``coefficients`` (n, 3)), shape
    ``shape``: the transpose of :func:`capped_integrals`' moments."""
    n0 = shape[0]
    a, b, _, live = _cut(xp, cells, psi)
    cell, segment, u, v = _pieces(xp, seeds, a, b, live, lo, hi, n0)
    k0, k1, k2 = (xp.take(coefficients[:, m], cell) for m in range(3))
    if len(shape) == 1:
        part = k0 * (v - u) + k1 * (v * v - u * u) / 2.0 + k2 * (v * v * v - u * u * u) / 3.0
        return _compat.segment_sum(xp, part, segment, n0)
    q = shape[1]
    per_basis = [0.0] * q
    for x, t, w in _nodes(xp, seeds, cell, segment, u, v, lo, hi, n0, q - 1):
        phi = w * (k0 + x * (k1 + x * k2))
        per_basis = [acc + phi * basis for acc, basis in zip(per_basis, bernstein_basis(xp, t, q - 1))]
    terms = xp.reshape(xp.stack(per_basis, axis=1), (-1,))                  # segment-major
    ids = xp.reshape(segment[:, None] * q + xp.arange(q, dtype=segment.dtype, device=aac.device(segment))[None, :],
                     (-1,))
    return xp.reshape(_compat.segment_sum(xp, terms, ids, n0 * q), (n0, q))
