"""Power (Laguerre) cells in 3D and the integrals of a voxel density over them.

What the Newton loop (:mod:`..newton`) asks of the geometry (see :mod:`..geometry`):
:func:`power_cells` (:mod:`.diagram`, clipping polyhedra, :mod:`.polyhedra`) and
:data:`CAPACITY`, its facet slots per cell; :func:`fans` and :func:`hiding_step` (:mod:`.hiding`);
:func:`c_transform`; and :mod:`.integrate`, the exact integrals of a voxel density
over the cells (their boundary triangles integrated by :mod:`.faces`).
"""
from __future__ import annotations

from . import integrate
from .diagram import c_transform, power_cells
from .hiding import fans, hiding_step
from .polyhedra import CAPACITY

__all__ = ["CAPACITY", "c_transform", "fans", "hiding_step", "integrate", "power_cells"]
