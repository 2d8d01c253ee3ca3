"""The tuning values of the damped Newton solve (:func:`.newton.solve`), as one value.

:class:`NewtonOptions` is frozen, hence hashable: the jitted JAX solve takes it as a
static argument. The solver uses :data:`DEFAULT`; a variant is
``dataclasses.replace(DEFAULT, hiding_margin=...)``, passed explicitly.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class NewtonOptions:
    """Thresholds and factors of :func:`.newton.solve`: the Newton matrix, the damping,
    the linear solves, the start, the stages of the continuation, the lift and the stall
    test."""

    #: Added to the Newton matrix's diagonal, times its mean diagonal: fixes the constant
    #: null space of the Laplacian.
    regularisation: float = 1e-9
    #: The first damping trial of a step is ``min(1, growth * t)``, ``t`` that of the last step.
    growth: float = 4.0
    #: ... or ``min(1, damped_growth * t)`` if the last step had to be damped (damped steps
    #: stay damped for a while).
    damped_growth: float = 1.5
    #: The first trial is at most this share of the ``t`` that certainly hides a seed (cells
    #: go empty earlier than the fan test sees; 0.8 gave the fewest diagrams of 0.8 to 0.999).
    hiding_margin: float = 0.8
    #: Factor of ``t`` after a rejected trial.
    backtrack: float = 0.7
    #: Relative residual of the linear solves away from the solution (inexact Newton, see
    #: :func:`.newton._linear_rtol`).
    forcing: float = 1e-2
    #: The start is the Voronoi diagram if every cell holds this share of its target (the
    #: damped Newton method copes with it), else see :func:`.newton.initial_weights`.
    start_admissible: float = 1e-2
    #: A width of the continuation is taken when every cell holds this share of its target
    #: against the density blurred to it.
    admissible: float = 0.1
    #: The density itself is taken when every cell holds this share of its target against
    #: it; at the narrowest width, cells that hold less are lifted (:func:`.newton.lifted`).
    final_admissible: float = 0.1
    #: Passes of the lift (a raised cell takes its neighbours' mass: they may fall short in turn).
    lift_passes: int = 3
    #: Rounds of doubling of the raises per pass of the lift (2^18 spans the raises measured).
    lift_rounds: int = 18
    #: Bisections of the raises per pass of the lift.
    lift_bisections: int = 6
    #: At a width ``s > 0`` (of the domain's side) targets are raised to at least
    #: ``wide_floor * s^floor_power`` times their mean (and scaled back to the total): cells of
    #: tiny targets are crushed by their neighbours' moves at every narrowing of the blur.
    wide_floor: float = 1.0
    floor_power: float = 0.5
    #: Newton steps at a width > 0 run until every cell is within this relative error.
    stage_tol: float = 0.7
    #: The widest width of the continuation, in units of the longest side of the domain.
    widest: float = 1.0
    #: Widths narrower than this share of the longest side are not tried (the next one is
    #: the density itself).
    min_width: float = 1e-5
    #: Narrowing factor of the width first tried.
    first_ratio: float = 4.0
    #: Largest narrowing factor (after a stage, twice the last one, at most this).
    max_ratio: float = 16.0
    #: Smallest narrowing factor (the search takes square roots down to it).
    min_ratio: float = 1.2
    #: Margin of the similarity start in the support's box (a share of its sides).
    start_margin: float = 0.1
    #: Quantile of the Diracs' coordinates that bounds the box the similarity start moves
    #: (and ``1 -`` it).
    start_quantile: float = 0.02
    #: That box's largest reach from the median, in interquartile ranges (uniform Diracs: 2;
    #: one Dirac at 1e6 among 39, kept by the quantile, squeezed the others and stalled the solve).
    start_spread: float = 4.0
    #: Steps in a row without an accepted trial, or with one shorter than ``stall_step``,
    #: after which the solve stops.
    stalls: int = 3
    #: Accepted steps shorter than this count as stalled (one Dirac at 1e6: 290 steps damped
    #: to about 1e-9).
    stall_step: float = 1e-8


#: The options the solver uses.
DEFAULT = NewtonOptions()
