"""The rules of a damped Newton step, written once for every loop that takes one: the
single-process solve (:func:`.newton.solve`, eager and traced), partial transport
(:func:`.partial.solve`) and the distributed solve (:mod:`sdot._dask.solve`, on Python floats
with ``xp = numpy``).

A step from weights ``psi`` along ``d`` tries ``psi + t d`` (Kitagawa, Merigot and Thibert's
damped Newton method): the first trial from the last step's (:func:`next_first`) and the
geometry's bound on the ``t`` that hides a seed (:func:`first_trial`), then ``t`` times
``options.backtrack`` while a trial is rejected (:func:`more_trials`); a trial is accepted
if its diagram is sound, every cell keeps the floor (:func:`mass_floor`) and the error's
norm falls by ``1 - t / 2`` (:func:`accepted`). A step accepted at ``t`` below
``options.stall_step``, or not at all, is a stall; ``options.stalls`` in a row stop the
solve (:func:`stalls_after`, :func:`stopped`). The linear solve of a direction is inexact,
to :func:`linear_rtol`. Every function takes arrays of the namespace ``xp`` (0-d, possibly
traced) or Python floats with ``xp = numpy``; ``options`` is a :class:`.options.NewtonOptions`.
"""
from __future__ import annotations


def mass_floor(xp, goal, masses, active):
    """Half the smallest of the targets ``goal`` and of the ``masses`` of the first diagram,
    over the ``active`` cells: every accepted trial keeps each cell above it."""
    smallest = lambda x: xp.min(xp.where(active, x, xp.inf))      # noqa: E731
    return 0.5 * xp.minimum(smallest(goal), smallest(masses))


def first_trial(xp, first, hidden_at, dim, options):
    """The first trial of a step: ``first`` (see :func:`next_first`) bounded by
    ``options.hiding_margin`` times ``hidden_at``, the ``t`` that certainly hides a seed (``inf``
    where unknown); in the dimensions ``options.hiding_on_the_backtracking`` instead the largest
    ``first * backtrack^k`` (``k >= 0``) below ``hidden_at``: the trials of plain backtracking,
    less those certain to be rejected."""
    if dim not in options.hiding_on_the_backtracking:
        return xp.minimum(first, options.hiding_margin * hidden_at)
    factor = xp.full_like(first, options.backtrack)
    k = xp.floor(xp.log(xp.maximum(first / hidden_at, 1e-300)) / -xp.log(factor)) + 1.0
    return first * factor ** xp.where(first >= hidden_at, k, 0.0)


def more_trials(t, options):
    """Whether a rejected trial at ``t`` is followed by one at ``options.backtrack * t``: not
    below ``options.min_step``."""
    return options.backtrack * t > options.min_step


def backtracking(t, trial, options):
    """Eagerly, the trials of a step from ``t``: ``trial(t) -> (result, accepted)``, then at
    ``options.backtrack * t`` while rejected and :func:`more_trials`; ``(t, result, accepted)``
    of the last one. (The traced solve runs the same in a ``while_loop``.)"""
    while True:
        result, ok = trial(t)
        if ok or not more_trials(t, options):
            return t, result, ok
        t *= options.backtrack


def accepted(sound, smallest, floor, norm_t, norm0, t):
    """The damping test of a trial at ``t``: a ``sound`` diagram (certified cells, no
    overflow), the ``smallest`` cell mass at least ``floor`` and the error's norm ``norm_t``
    at most ``(1 - t / 2)`` times the step's first ``norm0``."""
    return sound & (smallest >= floor) & (norm_t <= (1.0 - 0.5 * t) * norm0)


def next_first(xp, t, first, options):
    """The next step's first trial after one accepted at ``t`` whose first trial was
    ``first``: ``options.growth * t``, or ``options.damped_growth * t`` if the step was damped
    (damped steps stay damped for a while), at most 1."""
    return xp.minimum(xp.where(t < first, options.damped_growth * t, options.growth * t), 1.0)


def stalls_after(xp, ok, t, stalls, options):
    """Stalled steps in a row after a step accepted (``ok``) at ``t``: none after a step of at
    least ``options.stall_step``, one more otherwise."""
    return xp.where(ok & (t >= options.stall_step), 0, stalls + 1)


def stopped(stalls, options):
    """Whether the solve stops for stalls."""
    return stalls >= options.stalls


def linear_rtol(xp, tol, norm, t, spread, options):
    """Relative residual of the linear solve of a direction (an inexact Newton method).

    The residual ``r`` of ``DG d = rhs`` adds ``t r`` to the next masses' error, so
    ``|r| <= 0.1 tol`` (``norm``, the Euclidean norm of the mass error) keeps it a tenth of
    the tolerance; further from the solution ``options.forcing`` is enough: the next error
    is then about ``C |rhs|^2 + forcing |rhs|`` (undamped) or ``(1 - t + t forcing) |rhs|``
    (at 1e5 seeds, the same steps in fewer conjugate gradient iterations than tighter
    solves). ``spread``, the smallest target over the largest: an L2 residual does not see
    the cells of the smallest targets, so the forcing is scaled by it. After a step damped
    below ``options.tiny_step`` (``t``: the last accepted, 0 if none), the forcing is
    ``options.tiny_step_forcing`` times smaller: a loose solve's residual, spread over the
    cells, can exceed a poor cell's deficit and shrink it further at every step (clusters of
    400 Diracs, cells at 138 times their targets: the poorest cell sank to the floor and the
    solve stalled).
    """
    forcing = options.forcing * xp.where(t < options.tiny_step, xp.full_like(t, options.tiny_step_forcing), 1.0)
    return xp.maximum(0.1 * tol / xp.where(norm > 0, norm, 1.0), forcing * spread)
