"""The step that balances separate pieces: an exact line search of the dual.

Where every facet between two groups of cells crosses a zero of the density (two
Diracs against two pixels, three against two), the Newton matrix has a null direction
per group: the linearisation does not see that shifting a group's weights together moves
mass to it once its cells reach the other piece. Its direction is then as wide as the
regulariser makes it (wider than the squared diameter, or not finite), and no step of the
damping along it reduces the residual: the masses do not change until a cell boundary
reaches the other piece, and a halved step overshoots it.

The dual ``phi(psi) = sum_i psi_i nu_i - int min_i (|x - y_i|^2 - psi_i) rho(x) dx`` is
concave, of gradient ``nu - m(psi)`` (targets minus cell masses). Along a direction ``d``
its slope ``phi'(t) = <d, nu - m(psi + t d)>`` does not increase with ``t``: the sign of
the slope tells on which side of the line's maximum a trial lies, whatever the residual
does there. Bisecting on it finds where the groups' masses balance (the boundary inside
the heavier pixel), from where Newton steps converge.
"""
from __future__ import annotations

import array_api_compat as aac

from . import _compat


def balancing_step(xp, trial, d, rhs, active, reach2, bisections, like):
    """``(t, evaluation, accepted, d)``: the first trial that the damping accepts while
    bisecting ``t`` in ``[0, 1]`` on the sign of the dual's slope along ``d`` (returned as
    scaled).

    ``d`` is scaled to a span (max - min over the ``active`` Diracs) of ``reach2``, the
    squared diameter of the seeds and the domain (no two nonempty cells' weights differ by
    more); a ``d`` that is not finite is replaced by ``rhs``, the masses' deficits (the
    dual's gradient, an ascent direction too). ``trial(t, d)`` evaluates ``psi + t d`` and
    returns ``(evaluation, past, accepted)``: ``past`` if the trial lies beyond the maximum
    (a negative slope, or a diagram with an empty or unsound cell: the weights at which
    every cell is nonempty form a convex set). At most ``bisections`` trials after ``t = 1``;
    if none is accepted, the last one short of the maximum is (the dual rose), if any.
    ``like``: an evaluation of the trials' structure (the loop's initial value: the trial at
    ``t = 1`` runs in the loop's body too, one diagram in a traced program).
    """
    d = xp.where(xp.all(xp.isfinite(d)), d, rhs)
    span = xp.max(xp.where(active, d, -xp.inf)) - xp.min(xp.where(active, d, xp.inf))
    d = xp.where(active, d * (reach2 / xp.where(span > 0, span, 1.0)), 0.0)
    one, zero = xp.ones_like(reach2), xp.zeros_like(reach2)

    def cond(state):
        return ~state[7] | (~state[3] & (state[6] < bisections))

    # the first pass tries t = 1: accepted, or short of the maximum but not accepted (nothing
    # further along the line to find), no bisection; then each pass bisects [lo, hi]
    def body(state):
        lo, hi, _, _, at_lo, _, k, tried = state
        mid = xp.where(tried, 0.5 * (lo + hi), one)
        new, past, ok = trial(mid, d)
        back = past & tried
        at_lo = _compat.cond(back, lambda: at_lo, lambda: new)
        return (xp.where(past, xp.where(tried, lo, zero), mid), xp.where(back, mid, hi), mid,
                xp.where(tried, ok, ok | ~past), at_lo, new, xp.where(tried, k + 1, k), xp.ones_like(tried))

    k = xp.zeros((), dtype=xp.int64, device=aac.device(d))
    no = xp.zeros((), dtype=xp.bool, device=aac.device(d))
    lo, _, t, ok, at_lo, new, _, _ = _compat.while_loop(cond, body, (zero, one, one, no, like, like, k, no))
    # none accepted: the last trial short of the maximum, if any (the dual rose)
    t, new = _compat.cond(ok, lambda: (t, new), lambda: (lo, at_lo))
    return t, new, ok | (lo > 0), d


def slope(xp, d, deficits, active):
    """The dual's slope along ``d``: ``<d, nu - m>`` over the ``active`` Diracs (``deficits``
    the targets minus the masses)."""
    return xp.sum(xp.where(active, d * deficits, 0.0))
