"""Exact integrals of a segment density over 1D cells cut by balls (partial transport,
:mod:`..partial`): the interval ``[y + a, y + b]`` of a cell cut by ``[y - r, y + r]``,
``r = sqrt(psi)``, split at the grid's edges into pieces where the density is a constant.
"""
from __future__ import annotations

import array_api_compat as aac

from .. import _compat
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
    (ends relative to the seeds)."""
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


def capped_integrals(xp, seeds, cells, psi, values, lo, hi):
    """Per cell ``(mass, first, second)`` about the seed of its interval cut by its ball (n, 3),
    per end the density there if it bounds the cut interval (the facet's integral, (n, 2)), and
    per cell the density at the ball's ends that bound it (n,). Eager."""
    n, n0 = seeds.shape[0], values.shape[0]
    a, b, radius, live = _cut(xp, cells, psi)
    cell, segment, u, v = _pieces(xp, seeds, a, b, live, lo, hi, n0)
    c = xp.take(values, segment)
    parts = (c * (v - u), c * (v * v - u * u) / 2.0, c * (v * v * v - u * u * u) / 3.0)
    moments = xp.stack([_compat.segment_sum(xp, p, cell, n) for p in parts], axis=1)
    ends = cells.vertices[:, :, 0]
    inside = live[:, None] & (xp.abs(ends) < radius[:, None])
    facet = xp.where(inside, end_density(xp, seeds, cells, values, lo, hi), 0.0)
    balls = cells._replace(vertices=xp.stack([-radius, radius], axis=1)[:, :, None])
    at_balls = end_density(xp, seeds, balls, values, lo, hi)
    bounds = xp.stack([-radius > ends[:, 0], radius < ends[:, 1]], axis=1) & live[:, None]
    return moments, facet, xp.sum(xp.where(bounds, at_balls, 0.0), axis=1)


def capped_polynomial_integrals(xp, seeds, cells, psi, coefficients, lo, hi, shape):
    """Per grid segment ``sum_i int (a_i + b_i u + c_i u^2)`` over the cut intervals (``u = x -
    y_i``, ``coefficients`` (n, 3)), shape ``shape``: the transpose of :func:`capped_integrals`'
    moments."""
    n0 = shape[0]
    a, b, _, live = _cut(xp, cells, psi)
    cell, segment, u, v = _pieces(xp, seeds, a, b, live, lo, hi, n0)
    k0, k1, k2 = (xp.take(coefficients[:, m], cell) for m in range(3))
    part = k0 * (v - u) + k1 * (v * v - u * u) / 2.0 + k2 * (v * v * v - u * u * u) / 3.0
    return _compat.segment_sum(xp, part, segment, n0)
