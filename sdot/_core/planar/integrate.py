"""The integrals over the 2D cells that the solver and the plan's derivatives ask of the
geometry (``geometry.of(2).integrate``, the contract in :mod:`..geometry`), from the modules
that compute them: :mod:`.contour` (a constant per pixel: masses, moments and facet
integrals), :mod:`.sensitivity` (the integrals of the implicit differentiation and the potentials, by
the same walk), :mod:`.bernstein`, :mod:`.bernstein_transpose` and :mod:`.bernstein_facets` (a
Bernstein polynomial per pixel)."""
from .bernstein import bernstein_axis_second_moments, bernstein_cell_integrals
from .bernstein_facets import bernstein_facet_moments
from .bernstein_transpose import bernstein_polynomial_integrals, bernstein_potential_integrals
from .contour import cell_integrals, prefix_tables
from .sensitivity import axis_second_moments, facet_moments, polynomial_integrals, potential_integrals

__all__ = ["axis_second_moments", "bernstein_axis_second_moments", "bernstein_cell_integrals",
           "bernstein_facet_moments", "bernstein_polynomial_integrals", "bernstein_potential_integrals",
           "cell_integrals", "facet_moments", "polynomial_integrals", "potential_integrals", "prefix_tables"]
