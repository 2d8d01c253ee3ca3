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

from typing import NamedTuple

import array_api_compat as aac

from . import _compat


class Bisection(NamedTuple):
    """The line search's state: the bracket ``[lo, hi]`` of ``t``, the last trial short of the
    maximum ``at_lo`` (an evaluation), the bisections done ``k``, whether ``t = 1`` was
    ``tried``, and whether a trial was accepted (``ok``)."""

    lo: object
    hi: object
    at_lo: object
    k: object
    tried: object
    ok: object


def direction(xp, d, rhs, active, reach2):
    """The line's direction: ``d`` scaled to a span (max - min over the ``active`` Diracs) of
    ``reach2``, the squared diameter of the seeds and the domain (no two nonempty cells'
    weights differ by more); a ``d`` that is not finite is replaced by ``rhs``, the masses'
    deficits (the dual's gradient, an ascent direction too)."""
    d = xp.where(xp.all(xp.isfinite(d)), d, rhs)
    span = xp.max(xp.where(active, d, -xp.inf)) - xp.min(xp.where(active, d, xp.inf))
    return xp.where(active, d * (reach2 / xp.where(span > 0, span, 1.0)), 0.0)


def start(xp, like, t):
    """The state before the first trial (``like``: an evaluation of the trials' structure, ``t``
    a scalar of their dtype)."""
    no = xp.zeros((), dtype=xp.bool, device=aac.device(t))
    return Bisection(xp.zeros_like(t), xp.ones_like(t), like, xp.zeros((), dtype=xp.int64, device=aac.device(t)), no,
                     no)


def more(search, bisections):
    """Whether to try again: ``t = 1`` first; then, while none is accepted, at most
    ``bisections`` trials."""
    return ~search.tried | (~search.ok & (search.k < bisections))


def next_t(xp, search):
    """The next trial: ``t = 1``, then the middle of the bracket."""
    return xp.where(search.tried, 0.5 * (search.lo + search.hi), xp.ones_like(search.lo))


def after(xp, search, t, evaluation, past, accepted):
    """The state after the trial at ``t``: its ``evaluation``, whether it lies ``past`` the
    line's maximum (a negative slope, or a diagram with an empty or unsound cell: the weights
    at which every cell is nonempty form a convex set) and whether the damping ``accepted``
    it. The first trial (``t = 1``) ends the search if accepted, or if short of the maximum
    (nothing further along the line to find)."""
    tried = search.tried
    back = past & tried
    at_lo = _compat.cond(back, lambda: search.at_lo, lambda: evaluation)
    return Bisection(xp.where(past, xp.where(tried, search.lo, xp.zeros_like(t)), t), xp.where(back, t, search.hi),
                     at_lo, xp.where(tried, search.k + 1, search.k), xp.ones_like(tried),
                     xp.where(tried, accepted, accepted | ~past))


def result(search, t, evaluation):
    """``(t, evaluation, accepted)`` of the search whose last trial was ``evaluation`` at
    ``t``: that one if accepted; else the last trial short of the maximum, taken if there is
    one (the dual rose)."""
    t, evaluation = _compat.cond(search.ok, lambda: (t, evaluation), lambda: (search.lo, search.at_lo))
    return t, evaluation, search.ok | (search.lo > 0)


def slope(xp, d, deficits, active):
    """The dual's slope along ``d``: ``<d, nu - m>`` over the ``active`` Diracs (``deficits``
    the targets minus the masses)."""
    return xp.sum(xp.where(active, d * deficits, 0.0))
