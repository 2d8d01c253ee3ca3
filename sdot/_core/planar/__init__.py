"""Power (Laguerre) cells in 2D and the integrals of a pixel density over them.

What the Newton loop (:mod:`..newton`) asks of the geometry:

- :func:`power_cells`: the cells at some weights, built or updated from the cells at
  other weights (:mod:`.diagram`); :data:`CAPACITY`, their first vertex capacity;
- :func:`fans` and :func:`hiding_step`: the shortest step length that certainly empties
  a cell (:mod:`.hiding`).

The modules: :mod:`.polygons` (cells as polygons of fixed capacity, and the kernels
that clip them), :mod:`.kinetic` (the kinetic update and the rebuild), :mod:`.agreement`
(which cells disagree with their neighbours), :mod:`.repair` (until the area
certificate holds), :mod:`.diagram` (all of these together), :mod:`.hiding`, and
:mod:`.integrate` (exact integrals of a piecewise-constant grid density over the
cells, used by :class:`..density.PixelDensity`).
"""
from __future__ import annotations

from .diagram import power_cells
from .hiding import fans, hiding_step
from .polygons import CAPACITY, Cells

__all__ = ["CAPACITY", "Cells", "fans", "hiding_step", "power_cells"]
