"""Power (Laguerre) cells in 2D and the integrals of a pixel density over them.

What the Newton loop (:mod:`..newton`) asks of the geometry:

- :func:`power_cells`: the cells at some weights, built or updated from the cells at
  other weights (:mod:`.diagram`); :data:`CAPACITY`, their first vertex capacity;
- :func:`fans` and :func:`hiding_step`: the shortest step length that certainly empties
  a cell (:mod:`.hiding`);

and what the gradients (:mod:`..gradients`) ask of it: :func:`c_transform`, the
c-transform of the weights, a minimum over the cells' vertices (:mod:`.diagram`).
Of the cells (:class:`.polygons.Cells`) the Newton loop and the plan read only ``labels``
(n, V), the neighbour across each facet slot (negative: the box; V is the capacity),
``count`` (n,), the slots in use (0: an empty cell), the ``overflow`` and ``certified``
flags, and ``vertices`` (relative to the seeds: the plan scales them to the problem's
units); the density's ``integrals`` give the facet integrals per slot.

The modules: :mod:`.polygons` (cells as polygons of fixed capacity, and the kernels
that clip them), :mod:`.kinetic` (the kinetic update and the rebuild), :mod:`.agreement`
(which cells disagree with their neighbours), :mod:`.repair` (until the area
certificate holds), :mod:`.diagram` (all of these together), :mod:`.hiding`, and
:mod:`.contour` (exact integrals of a piecewise-constant grid density over the
cells, used by :class:`..density.PixelDensity`), :mod:`.sensitivity` (the integrals of
the plan's implicit differentiation, by the same walk), :mod:`.bernstein` and
:mod:`.bernstein_transpose` (exact integrals of a grid of Bernstein polynomials and their
transpose, by the same walk, used by :class:`..density.BernsteinDensity`) and
:mod:`.bernstein_facets` (its facet moments, for the plan's derivatives); all reached
through :mod:`.integrate`, which gathers them.
"""
from __future__ import annotations

from . import integrate
from .diagram import c_transform, power_cells
from .hiding import fans, hiding_step
from .polygons import CAPACITY

__all__ = ["CAPACITY", "c_transform", "fans", "hiding_step", "integrate", "power_cells"]
