"""Laguerre cells on a line (1D) and the exact integrals of a segment density over them.

In 1D a Laguerre cell is an interval, and the optimal weights have a closed form: sorted
by position, the Diracs take the density's mass in order, so the cell boundaries are the
density's inverse cumulative distribution at the cumulative masses (:mod:`.closed_form`).
No Newton step is needed; :func:`solve` replaces :func:`..newton.solve` in
:func:`..plan.solve_plan`.

What the dimension-free core asks of a geometry (:mod:`..geometry`):

- :data:`CAPACITY` (2: the two ends of an interval) and :func:`power_cells`, the cells at
  any weights (:mod:`.cells`: the lower envelope of the power functions);
- :func:`c_transform`, the mass gradient of a Dirac of zero mass;
- :func:`fans` and :func:`hiding_step`, which the closed form does not use (no Newton
  damping): ``None`` and ``inf``;
- :mod:`.integrate`: the exact integrals of a piecewise-constant density on a 1D grid, and
  (:mod:`.bernstein`) of a grid of Bernstein polynomials.

The cells (:class:`.cells.Intervals`): ``vertices`` (n, 2, 1) the two ends of each cell
relative to its seed (left, right), ``labels`` (n, 2) the neighbour across each end (-1:
the domain's lower end, -2: its upper end), ``count`` (n,) 2 for a cell of positive length
and 0 for an empty one (zero-mass Diracs, duplicates after the first, hidden seeds),
``overflow`` (n,) all False and ``certified`` () True.
"""
from __future__ import annotations

from . import integrate
from .cells import CAPACITY, Intervals, c_transform, fans, hiding_step, power_cells
from .closed_form import solve

__all__ = ["CAPACITY", "Intervals", "c_transform", "fans", "hiding_step", "integrate", "power_cells", "solve"]
