"""The geometry of each dimension: which package builds the cells and integrates over them.

A geometry package (:mod:`.planar` for 2D, :mod:`.spatial` for 3D, :mod:`.linear` for 1D)
exposes what the dimension-free core asks of the cells:

- ``CAPACITY``: the first slot capacity of a cell;
- ``power_cells(xp, seeds, psi, active, lo, hi, candidates, capacity, previous=,
  stop_if_empty=, options=)``: the cells at weights ``psi`` (a NamedTuple with at least
  ``labels`` (n, V), the neighbour across each facet slot, ``count`` (n,), ``overflow`` (n,),
  ``certified`` () and ``vertices`` (n, V', d) relative to the seeds);
- ``fans`` and ``hiding_step``: the Newton step length that certainly empties a cell
  (``inf`` where the geometry has no such bound);
- ``c_transform(xp, seeds, cells, psi)``: ``min_x |x - y_i|^2 - phi(x)`` over the domain;
- ``integrate.cell_integrals(xp, seeds, cells, values, lo, hi)`` and
  ``integrate.potential_integrals(xp, seeds, cells, psi, lo, hi, shape)``: the exact integrals
  of a piecewise-constant grid density (:class:`.density.PixelDensity`); for the implicit
  differentiation of the plan, ``integrate.facet_moments(xp, seeds, cells, values, lo, hi)``,
  ``integrate.polynomial_integrals(xp, seeds, cells, coefficients, lo, hi, shape)`` and
  ``integrate.axis_second_moments(xp, seeds, cells, values, lo, hi)`` (2D:
  :mod:`.planar.sensitivity`);
- optionally, for grids of Bernstein polynomials (:class:`.density.BernsteinDensity`),
  ``integrate.bernstein_cell_integrals(xp, seeds, cells, coefficients, lo, hi)`` and
  ``integrate.bernstein_potential_integrals(xp, seeds, cells, psi, lo, hi, coefficient_shape)``,
  and for the plan's derivatives ``integrate.bernstein_facet_moments``,
  ``integrate.bernstein_polynomial_integrals`` and ``integrate.bernstein_axis_second_moments``
  (the arguments of their piecewise-constant counterparts; 2D: :mod:`.planar.bernstein`,
  :mod:`.planar.bernstein_transpose`, :mod:`.planar.bernstein_facets`; 1D: :mod:`.linear.bernstein`;
  3D: :mod:`.spatial.bernstein`);
- optionally ``solve(xp, prob, active, targets, log=)``: a direct solve that replaces the
  Newton loop (1D, :mod:`.linear`: the sorted closed form), a :class:`.evaluation.Solution`
  in the problem's units.
"""
from __future__ import annotations

import importlib

#: The package of each supported dimension.
PACKAGES = {1: "linear", 2: "planar", 3: "spatial"}


def of(dim: int):
    """The geometry package of dimension ``dim`` (a ``NotImplementedError`` for others)."""
    if dim not in PACKAGES:
        raise NotImplementedError(f"sdot solves problems in dimensions {sorted(PACKAGES)}, not {dim}")
    return importlib.import_module(f".{PACKAGES[dim]}", __package__)


def of_seeds(seeds):
    """The geometry package of ``seeds`` (n, d)."""
    return of(seeds.shape[1])
