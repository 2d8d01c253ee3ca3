"""Target densities: what the solver asks of a density, and the pixel grid.

A density kind is a ``NamedTuple`` (hence a JAX pytree) of arrays with these methods,
each taking the array namespace ``xp`` first:

- ``integrals(xp, seeds, cells)``: per cell its mass, first moments and second moment
  about its seed ``(n, d + 2)`` (in 2D ``(mass, M_x, M_y, M_2)``) and per facet slot the
  density integrated over the facet ``(n, V)`` (the Newton matrix's facet terms), by the
  geometry of the dimension (:mod:`.geometry`);
- ``potential_integrals(xp, seeds, cells, psi)``: ``dQ/d(values)`` for
  ``Q = sum_i int_{L_i} (|x - y_i|^2 - psi_i) rho`` with the cells fixed, the
  gradient of W2^2 with respect to the density's parameters;
- ``blurred(xp, width)``: the density convolved with a kernel of ``width``, positive
  wherever the density has mass within a few widths (the continuation of the solve
  through zero regions, :mod:`.continuation`);
- ``support_box(xp)``: ``(lo, hi)``, a box that contains the density's support;
- ``normalised(centre, scale)``: the density in the coordinates ``(x - centre) / scale``,
  with the same total mass.

``lo`` and ``hi`` (its fields) bound the domain, where the cells live. The only kind
today is :class:`PixelDensity`; a Bernstein or spline grid is another
``NamedTuple`` with the same methods. Pixels (2D), voxels (3D) and segments (1D) are
the same kind: only the integrals depend on the dimension.
"""
from __future__ import annotations

from typing import NamedTuple

import array_api_compat as aac

from . import continuation, geometry


class PixelDensity(NamedTuple):
    """A density constant on each pixel (voxel in 3D) of a regular grid over the box
    ``[lo, hi]`` (each of shape (d,)).

    ``values`` (n_0, ..., n_{d-1}) are the pixel values (the density, not the pixel
    masses); a (1, ..., 1) grid is the uniform density on the box, integrated in closed form.
    """

    values: object
    lo: object
    hi: object

    def integrals(self, xp, seeds, cells):
        """``(moments, facet)``: see :func:`.planar.integrate.cell_integrals`."""
        return geometry.of_seeds(seeds).integrate.cell_integrals(xp, seeds, cells, self.values, self.lo, self.hi)

    def potential_integrals(self, xp, seeds, cells, psi):
        """Per pixel ``int_pixel phi``, ``phi(x) = |x - y_i|^2 - psi_i`` on cell i: see
        :func:`.planar.integrate.potential_integrals`."""
        return geometry.of_seeds(seeds).integrate.potential_integrals(xp, seeds, cells, psi, self.lo, self.hi, tuple(self.values.shape))

    def blurred(self, xp, width):
        """The values blurred to ``width`` (a 0-d array, in the domain's units) on the same grid."""
        return self._replace(values=continuation.blurred(xp, self.values, width, self.lo, self.hi))

    def support_box(self, xp):
        """``(lo, hi)``: the smallest box of whole pixels that holds every pixel of positive value."""
        values, lo, hi = self.values, self.lo, self.hi
        shape = xp.asarray(values.shape, dtype=lo.dtype, device=aac.device(lo))
        box_lo, box_hi = [], []
        d = values.ndim
        for axis in range(d):
            others = tuple(a for a in range(d) if a != axis)
            full = xp.astype(xp.any(values > 0, axis=others), xp.int8)      # slices with mass
            first = xp.astype(xp.argmax(full), lo.dtype)
            last = shape[axis] - 1 - xp.astype(xp.argmax(xp.flip(full)), lo.dtype)
            step = (hi[axis] - lo[axis]) / shape[axis]
            box_lo.append(lo[axis] + first * step)
            box_hi.append(lo[axis] + (last + 1.0) * step)
        return xp.stack(box_lo), xp.stack(box_hi)

    def normalised(self, centre, scale):
        """The density in the coordinates ``(x - centre) / scale``: the box moved and
        scaled, the values times ``scale^d`` (the total mass is unchanged)."""
        return PixelDensity(self.values * scale ** self.values.ndim, (self.lo - centre) / scale, (self.hi - centre) / scale)
