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
- for the derivatives of the plan (:mod:`.sensitivity`): ``facet_moments(xp, seeds, cells)``
  (per facet slot ``int rho (1, u, u u^T)``, ``u = x - y_i``), ``polynomial_integrals(xp, seeds,
  cells, coefficients)`` (the transpose of the cell moments, per parameter of the density) and
  ``axis_second_moments(xp, seeds, cells)`` (per cell ``int (x_a - y_ia)^2 rho`` by axis);
- ``blurred(xp, width)``: the density convolved with a kernel of ``width``, positive
  wherever the density has mass within a few widths (the continuation of the solve
  through zero regions, :mod:`.continuation`);
- ``support_box(xp)``: ``(lo, hi)``, a box that contains the density's support;
- ``normalised(centre, scale)``: the density in the coordinates ``(x - centre) / scale``,
  with the same total mass.

``lo`` and ``hi`` (its fields) bound the domain, where the cells live. The kinds:
:class:`PixelDensity` (a constant per grid cell) and :class:`BernsteinDensity` (a polynomial
of degree ``p`` per axis on each grid cell); :func:`grid_density` picks the one of an array of
values. Pixels (2D), voxels (3D) and segments (1D) are the same kind: only the integrals
depend on the dimension. Both expose their parameters as ``values`` (the array whose
gradient ``potential_integrals`` gives).
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

    def facet_moments(self, xp, seeds, cells):
        """``(f0, f1, f2)``: per facet slot ``int rho (1, u, u u^T)`` along the facet, ``u = x - y_i``:
        see :func:`.planar.sensitivity.facet_moments`."""
        return geometry.of_seeds(seeds).integrate.facet_moments(xp, seeds, cells, self.values, self.lo, self.hi)

    def polynomial_integrals(self, xp, seeds, cells, coefficients):
        """Per pixel ``sum_i int_{L_i & pixel} (a_i + b_i . u + c_i |u|^2)`` for ``coefficients``
        (n, d + 2): the transpose of the cell moments, see :func:`.planar.sensitivity.polynomial_integrals`."""
        return geometry.of_seeds(seeds).integrate.polynomial_integrals(xp, seeds, cells, coefficients, self.lo, self.hi,
                                                                       tuple(self.values.shape))

    def axis_second_moments(self, xp, seeds, cells):
        """Per cell ``int_{L_i} (x_a - y_ia)^2 rho`` for each axis (n, d)."""
        return geometry.of_seeds(seeds).integrate.axis_second_moments(xp, seeds, cells, self.values, self.lo, self.hi)

    def blurred(self, xp, width, periodic=None):
        """The values blurred to ``width`` (a 0-d array, in the domain's units) on the same grid
        (:func:`.continuation.blurred`; ``periodic``: per axis whether it wraps, on a periodic
        domain)."""
        return self._replace(values=continuation.blurred(xp, self.values, width, self.lo, self.hi, periodic))

    def support_box(self, xp):
        """``(lo, hi)``: the smallest box of whole pixels that holds every pixel of positive value."""
        return _box_of_cells(xp, self.values > 0, self.lo, self.hi)

    def normalised(self, centre, scale):
        """The density in the coordinates ``(x - centre) / scale``: the box moved and
        scaled, the values times ``scale^d`` (the total mass is unchanged)."""
        return PixelDensity(self.values * scale ** self.values.ndim, (self.lo - centre) / scale, (self.hi - centre) / scale)


def _box_of_cells(xp, positive, lo, hi):
    """``(lo, hi)``: the smallest box of whole grid cells of the box ``[lo, hi]`` that holds
    every cell where ``positive`` (a boolean array of the grid's shape)."""
    shape = xp.asarray(positive.shape, dtype=lo.dtype, device=aac.device(lo))
    box_lo, box_hi = [], []
    d = positive.ndim
    for axis in range(d):
        others = tuple(a for a in range(d) if a != axis)
        full = xp.astype(xp.any(positive, axis=others), xp.int8)           # slices with mass
        first = xp.astype(xp.argmax(full), lo.dtype)
        last = shape[axis] - 1 - xp.astype(xp.argmax(xp.flip(full)), lo.dtype)
        step = (hi[axis] - lo[axis]) / shape[axis]
        box_lo.append(lo[axis] + first * step)
        box_hi.append(lo[axis] + (last + 1.0) * step)
    return xp.stack(box_lo), xp.stack(box_hi)


def grid_density(values, lo, hi):
    """The density kind of grid ``values`` on the box ``[lo, hi]`` (each (d,)): a
    :class:`PixelDensity` if ``values`` has ``d`` axes, else a :class:`BernsteinDensity` (its
    last axis the ``(p+1)^d`` Bernstein coefficients of each grid cell)."""
    if values.ndim == lo.shape[0]:
        return PixelDensity(values, lo, hi)
    return BernsteinDensity(values, lo, hi)


def _bernstein_kernels(seeds):
    """The integrate module of the geometry of ``seeds``, if it integrates Bernstein grids."""
    module = geometry.of_seeds(seeds).integrate
    if not hasattr(module, "bernstein_cell_integrals"):
        raise NotImplementedError(f"PolynomialGrid of degree p > 0 is not supported yet in {seeds.shape[1]}D: "
                                  "use one value per grid cell")
    return module


class BernsteinDensity(NamedTuple):
    """A density polynomial of degree ``p`` per axis on each cell of a regular grid over the
    box ``[lo, hi]`` (each of shape (d,)).

    ``coefficients`` (n_0, ..., n_{d-1}, (p+1)^d) are the Bernstein coefficients of each grid
    cell, in C order (``docs/densities.md``): in the cell's coordinates ``t`` in
    ``[0, 1]^d``, ``rho = sum_k c[..., k] prod_a B(k_a, p, t_a)``, ``B(k, p, t) = C(p, k) t^k
    (1 - t)^(p - k)``. The cell's mean is the mean of its coefficients.
    """

    coefficients: object
    lo: object
    hi: object

    @property
    def values(self):
        """The parameters of the density (its ``coefficients``), as the protocol names them."""
        return self.coefficients

    def integrals(self, xp, seeds, cells):
        """``(moments, facet)``: see :func:`.planar.bernstein.bernstein_cell_integrals`."""
        return _bernstein_kernels(seeds).bernstein_cell_integrals(xp, seeds, cells, self.coefficients, self.lo, self.hi)

    def potential_integrals(self, xp, seeds, cells, psi):
        """Per grid cell and basis function ``int B_k phi``, ``phi(x) = |x - y_i|^2 - psi_i`` on
        cell i: see :func:`.planar.bernstein.bernstein_potential_integrals`."""
        return _bernstein_kernels(seeds).bernstein_potential_integrals(
            xp, seeds, cells, psi, self.lo, self.hi, tuple(self.coefficients.shape))

    def facet_moments(self, xp, seeds, cells):
        """``(f0, f1, f2)``: per facet slot ``int rho (1, u, u u^T)`` along the facet: see
        :func:`.planar.bernstein_facets.bernstein_facet_moments`."""
        return _bernstein_kernels(seeds).bernstein_facet_moments(xp, seeds, cells, self.coefficients, self.lo, self.hi)

    def polynomial_integrals(self, xp, seeds, cells, coefficients):
        """Per grid cell and basis function ``sum_i int_{L_i & cell} B_k (a_i + b_i . u + c_i |u|^2)``:
        see :func:`.planar.bernstein_transpose.bernstein_polynomial_integrals`."""
        return _bernstein_kernels(seeds).bernstein_polynomial_integrals(
            xp, seeds, cells, coefficients, self.lo, self.hi, tuple(self.coefficients.shape))

    def axis_second_moments(self, xp, seeds, cells):
        """Per cell ``int_{L_i} (x_a - y_ia)^2 rho`` for each axis (n, d)."""
        return _bernstein_kernels(seeds).bernstein_axis_second_moments(xp, seeds, cells, self.coefficients,
                                                                       self.lo, self.hi)

    def blurred(self, xp, width, periodic=None):
        """The cell means blurred to ``width`` (:func:`.continuation.blurred`), each the constant
        polynomial of its cell (all its coefficients equal): a path for the continuation, whose
        last stage solves the density itself."""
        c = self.coefficients
        means = continuation.blurred(xp, xp.mean(c, axis=-1), width, self.lo, self.hi, periodic)
        return self._replace(coefficients=xp.broadcast_to(means[..., None], c.shape))

    def support_box(self, xp):
        """``(lo, hi)``: the smallest box of whole grid cells that holds every cell with a
        positive coefficient (the density is positive inside such a cell, 0 on the others)."""
        return _box_of_cells(xp, xp.any(self.coefficients > 0, axis=-1), self.lo, self.hi)

    def normalised(self, centre, scale):
        """The density in the coordinates ``(x - centre) / scale``: the box moved and scaled,
        the coefficients times ``scale^d`` (the total mass is unchanged)."""
        d = self.coefficients.ndim - 1
        return BernsteinDensity(self.coefficients * scale ** d, (self.lo - centre) / scale, (self.hi - centre) / scale)
