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
from . import circle
from .cdf import inverse_cdf, prefix_sums
from .cells import intervals, live_order


def solve(xp, prob, active, targets, log=None):
    """The :class:`..evaluation.Solution` of ``prob`` in closed form, in the problem's units:
    the weights ``psi`` (0 on the inactive Diracs), the cells and their moments, the max
    cell-mass error (rounding: the plan is exact), no Newton step."""
    if prob.period is not None:                      # the circle (:mod:`.circle`): the cells are the sites'
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
