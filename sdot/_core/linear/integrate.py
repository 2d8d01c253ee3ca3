"""The integrals over the 1D cells that the solver and the plan's derivatives ask of the
geometry (``geometry.of(1).integrate``, the contract in :mod:`..geometry`), from the modules
that compute them: :mod:`.segments` (a constant per grid segment) and :mod:`.bernstein` (a
Bernstein polynomial per segment)."""
from .bernstein import (bernstein_axis_second_moments, bernstein_cell_integrals, bernstein_facet_moments,
                        bernstein_polynomial_integrals, bernstein_potential_integrals)
from .segments import (axis_second_moments, cell_integrals, end_moments, facet_moments, grid_edges, pieces,
                       polynomial_integrals, potential_integrals)

__all__ = ["axis_second_moments", "bernstein_axis_second_moments", "bernstein_cell_integrals",
           "bernstein_facet_moments", "bernstein_polynomial_integrals", "bernstein_potential_integrals",
           "cell_integrals", "end_moments", "facet_moments", "grid_edges", "pieces", "polynomial_integrals",
           "potential_integrals"]
