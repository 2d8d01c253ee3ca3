"""The 1D transport in closed form: sorted Diracs, cumulative masses, inverse CDF.

On a line the optimal map is monotone: sorted by position, the Diracs of positive mass
(exact duplicates merged, :func:`..evaluation.group_duplicates`) take the density's mass in
order, so the boundary between consecutive Diracs ``i < j`` is where the density's
cumulative distribution ``F`` reaches ``C_i``, the masses of the Diracs up to i. ``F`` is
piecewise linear (the density is constant on each grid segment) and is inverted exactly,
segment by segment; for a grid of Bernstein polynomials of degree ``p`` it is a polynomial
of degree ``p + 1`` on each segment, inverted to rounding (:mod:`.bernstein`).

Where the level ``C_i`` falls on a flat part of ``F`` (a zero-density gap, or an end of
the domain where the density is 0), any boundary in the gap gives the same masses: the
midpoint ``(y_i + y_j) / 2`` (the Voronoi boundary) clamped into the gap. A level within
a few roundings of the mass at a grid edge is taken as that mass, so that a gap meant by
the input (equal masses on either side of a hole) is seen as one.

The weights follow from the boundaries: at the boundary ``x_b`` the two power functions
are equal, ``(x_b - y_i)^2 - psi_i = (x_b - y_j)^2 - psi_j``, so
``psi_j - psi_i = (y_j - y_i) ((y_j - x_b) + (y_i - x_b))``, a cumulative sum. With the
boundaries nondecreasing, the cells of these weights are exactly the intervals.
"""
from __future__ import annotations

import array_api_compat as aac

from .. import _compat, evaluation, periodic
from . import bernstein, integrate
from .cells import clamp, intervals, live_order


def solve(xp, prob, active, targets, log=None):
    """The :class:`..evaluation.Solution` of ``prob`` in closed form, in the problem's units:
    the weights ``psi`` (0 on the inactive Diracs), the cells and their moments, the max
    cell-mass error (rounding: the plan is exact), no Newton step."""
    if prob.period is not None:                      # the circle (:mod:`.circle`): the cells are the sites'
        from . import circle

        psi, cells, sites, owner = circle.weights_and_cells(xp, prob, active, targets)
        moments, facet = prob.density.integrals(xp, sites, cells)
        moments = periodic.folded_rows(xp, moments, owner, prob.seeds.shape[0])
    else:
        psi, cells = weights_and_cells(xp, prob.seeds, active, targets, prob.density.values, prob.lo, prob.hi)
        moments, facet = prob.density.integrals(xp, prob.seeds, cells)
    residual, converged, status = _report(xp, moments, targets, active)
    dev = aac.device(psi)
    steps = xp.asarray(0, dtype=xp.int64, device=dev)
    if log is not None:
        _compat.host_call(log, steps, residual, xp.zeros_like(residual), xp.zeros_like(residual))
    return evaluation.Solution(psi, evaluation.Evaluation(cells, moments, facet), residual, steps, converged, status,
                           xp.zeros_like(residual), xp.ones_like(residual), xp.asarray(False, device=dev))


@_compat.jit_on_jax()
def _report(xp, moments, targets, active):
    residual = xp.max(xp.where(active, xp.abs(moments[:, 0] - targets), 0.0))
    converged = xp.isfinite(residual)
    code = lambda c: xp.asarray(c, device=aac.device(residual))      # noqa: E731
    return residual, converged, xp.where(converged, code(evaluation.CONVERGED), code(evaluation.UNSOUND))


@_compat.jit_on_jax()
def weights_and_cells(xp, seeds, active, targets, values, lo, hi):
    """``(psi, cells)``: the optimal weights (0 on the inactive Diracs) and the cells
    (:class:`.cells.Intervals`) of the ``active`` Diracs of masses ``targets`` against the
    density ``values`` (n0,) on ``[lo, hi]`` (of the same total mass)."""
    n = seeds.shape[0]
    dev = aac.device(seeds)
    y = seeds[:, 0]
    order, _, n_active = live_order(xp, y, active)
    ys, ts = xp.take(y, order), xp.take(targets, order)
    k = xp.arange(n, dtype=xp.int64, device=dev)
    live = k < n_active
    levels = prefix_sums(xp, ts)[:-1]                # the mass up to each Dirac, but the last
    boundary = inverse_cdf(xp, levels, 0.5 * (ys[:-1] + ys[1:]), values, lo, hi)    # (n - 1,)
    inner = k[:-1] < n_active - 1                    # a boundary between two live Diracs
    boundary = xp.where(inner, boundary, hi[0])
    left, right = xp.concat([lo, boundary]), xp.concat([boundary, hi])
    gaps = ys[1:] - ys[:-1]
    steps = xp.where(inner, gaps * ((ys[1:] - boundary) + (ys[:-1] - boundary)), 0.0)
    psi = xp.concat([xp.zeros((1,), dtype=y.dtype, device=dev), xp.cumulative_sum(steps)])
    previous = xp.where(k > 0, xp.take(order, xp.maximum(k - 1, 0)), -1)
    following = xp.where(k < n_active - 1, xp.take(order, xp.minimum(k + 1, n - 1)), -2)
    cells = intervals(xp, seeds, order, left, right, live, previous, following)
    psi = xp.take(xp.where(live, psi, 0.0), xp.argsort(order, stable=True))
    return psi, cells


def inverse_cdf(xp, levels, preferred, values, lo, hi):
    """Points ``x`` (of ``levels``' shape) where the cumulative distribution of the density
    ``values`` on ``[lo, hi]`` reaches ``levels`` (nondecreasing): on a flat part of it (a
    zero-density gap), the point of the gap nearest to ``preferred``.

    ``F`` is linear on each grid segment of constant ``values`` (n0,): ``x = e_k + (C - P_k) /
    c_k`` on segment ``k`` (``P_k`` the mass before its left edge ``e_k``), clamped into the
    segment (then monotone in ``C``). For Bernstein coefficients ``values`` (n0, p + 1), ``F`` is
    a polynomial of degree ``p + 1`` on each segment, inverted by
    :func:`.bernstein.segment_inverse`. A gap's ends are the lower and upper inverses of its
    level. A level within ``4 eps`` of the total of a grid edge's ``P`` is moved onto it.
    """
    n0 = values.shape[0]
    edges, cumulative = cumulative_masses(xp, values, lo, hi)
    polynomial = values.ndim == 2                    # Bernstein coefficients (n0, p + 1)
    # snap onto the mass at the nearest edge
    above = clamp(xp, xp.searchsorted(cumulative, levels), 1, n0)
    lower, upper = xp.take(cumulative, above - 1), xp.take(cumulative, above)
    nearest = xp.where(levels - lower < upper - levels, lower, upper)
    close = xp.abs(levels - nearest) <= 4.0 * xp.finfo(values.dtype).eps * cumulative[-1]
    levels = xp.where(close, nearest, levels)

    def on_segment(k, t=None):
        """The inverse on segment ``k`` (-1: before the domain, ``n0``: after it); ``t`` the
        polynomial's coordinate there (:func:`.bernstein.segment_inverse`)."""
        s = clamp(xp, k, 0, n0 - 1)
        e0, e1 = xp.take(edges, s), xp.take(edges, s + 1)
        if polynomial:
            if t is None:
                t = bernstein.segment_inverse(xp, xp.take(values, s, axis=0),
                                              (levels - xp.take(cumulative, s)) / (e1 - e0))
            x = e0 + t * (e1 - e0)
        else:
            c = xp.take(values, s)
            x = e0 + xp.where(c > 0, (levels - xp.take(cumulative, s)) / xp.where(c > 0, c, 1.0), 0.0)
        x = clamp(xp, x, e0, e1)
        return xp.where(k < 0, lo[0], xp.where(k >= n0, hi[0], x))

    k_first = xp.searchsorted(cumulative, levels, side="left") - 1
    k_last = xp.searchsorted(cumulative, levels, side="right") - 1
    first = on_segment(k_first)                                 # inf {x : F(x) >= C}
    if polynomial:      # sup {x : F(x) <= C}: the same point, or C is the mass at k_last's left edge
        last = xp.where(k_last == k_first, first, on_segment(k_last, xp.zeros_like(levels)))
    else:
        last = on_segment(k_last)
    return xp.minimum(xp.maximum(preferred, first), xp.maximum(first, last))


def cumulative_masses(xp, values, lo, hi):
    """``(edges, cumulative)`` (n0 + 1,): the grid's edges and the density's mass before each
    (``values``: constant per segment (n0,) or Bernstein coefficients (n0, p + 1))."""
    n0 = values.shape[0]
    edges = integrate.grid_edges(xp, lo, hi, n0)
    polynomial = values.ndim == 2
    masses = bernstein.segment_masses(xp, values, lo, hi) if polynomial else values * (edges[1:] - edges[:-1])
    zero = xp.zeros((1,), dtype=values.dtype, device=aac.device(values))
    return edges, xp.concat([zero, prefix_sums(xp, masses)])


def prefix_sums(xp, x, block: int = 32):
    """``cumulative_sum(x)`` (1-d) in blocks: sums within blocks of ``block`` entries, plus the
    prefix sums of the blocks' totals, recursively. Its rounding error grows as
    ``block log(n)`` instead of ``n`` (a sequential sum): the last cell, whose mass is the
    total less the others' cumulative mass, absorbed it (at 1e6 Diracs, a mass error of
    8e-12 sequentially, 1e-15 in blocks; 9e-6 at 1000 Diracs in FP32)."""
    n = x.shape[0]
    if n <= block:
        return xp.cumulative_sum(x)
    rows = -(-n // block)
    padded = xp.concat([x, xp.zeros((rows * block - n,), dtype=x.dtype, device=aac.device(x))])
    inner = xp.cumulative_sum(xp.reshape(padded, (rows, block)), axis=1)
    totals = prefix_sums(xp, inner[:, -1], block)
    before = xp.concat([xp.zeros((1,), dtype=x.dtype, device=aac.device(x)), totals[:-1]])
    return xp.reshape(inner + before[:, None], (-1,))[:n]
