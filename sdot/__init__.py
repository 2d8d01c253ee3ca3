"""sdot: exact semi-discrete optimal transport on NumPy, PyTorch and JAX.

The W2 transport between a sum of Dirac masses and a density on a grid, its
Laguerre (power) diagram and its gradients, written once against the Python
array API. See ``docs/getting-started.md``.
"""
from ._driver import driver
from ._measures import (BatchOfSumOfDiracs, BatchOfSumOfWeightedDiracs, SumOfDiracs,
                        SumOfDiracs1d, SumOfWeightedDiracs)
from ._grids import Grid, PolynomialGrid
from ._spline_grid import SplineGrid
from ._grid_batches import BatchOfPolynomialGrid, BatchOfSplineGrid
from ._api import (OtNotConverged, OtPlan, barycenters, default_tolerance, distance,
                   distances, optimal_transport_plan)
from ._diagram import Cell, PowerDiagram
from . import metrics

__version__ = "0.1.0"

__all__ = [
    "driver",
    "SumOfDiracs", "SumOfWeightedDiracs", "BatchOfSumOfDiracs", "BatchOfSumOfWeightedDiracs",
    "SumOfDiracs1d", "PolynomialGrid", "Grid", "SplineGrid", "BatchOfPolynomialGrid", "BatchOfSplineGrid",
    "distance", "distances", "barycenters", "optimal_transport_plan", "default_tolerance",
    "OtPlan", "OtNotConverged", "PowerDiagram", "Cell", "metrics",
]
