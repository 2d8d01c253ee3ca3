"""``SplineGrid``: a uniform tensor-product B-spline density, exactly a ``PolynomialGrid``."""
from __future__ import annotations

import numbers

import numpy as np

from . import _driver, _splines
from ._driver import is_tracer, namespace
from ._grids import MAX_DEGREE, PolynomialGrid, degree_error
from ._measures import _describe, _known

__all__ = ["SplineGrid"]


class SplineGrid(PolynomialGrid):
    """A uniform tensor-product B-spline density on a regular grid over ``domain``.

    Along an axis of ``n`` cells, in cell units (the domain's side is ``[0, n]``),
    ``S(x) = sum over integers i of c[clamp(i, 0, n-1)] N_p(x - i - 1/2)``, with
    ``N_p`` the centred cardinal B-spline of degree ``p = continuity + 1`` (support
    ``[-(p+1)/2, (p+1)/2]``): the control value of cell ``j`` sits at its centre and
    the border values repeat beyond the edges. In ``d`` dimensions the density is
    the tensor product, zero outside the domain. It is exactly a
    :class:`PolynomialGrid` of degree ``p`` (:meth:`as_polynomial_grid`), one
    polynomial per knot span: on the same grid for even ``p`` (knots on the cell
    faces), on a grid with twice as many cells per axis for odd ``p`` (knots at
    the cell centres: each cell is cut in two there). The solver reads the spline
    as that grid.

    Parameters
    ----------
    values : array_like, shape (n0, ..., n_{d-1})
        The control values ``c``, one per cell; finite, >= 0 and not all zero.
        With ``interpolate=True``: the values of ``S`` at the cell centres.
    continuity : int, default 1
        ``S`` has ``continuity`` continuous derivatives (degree ``continuity + 1``), at most 16
        (beyond it the integrals over the cells lose digits in FP64: ``ValueError``).
    domain : pair (lo, hi), optional
        As for :class:`PolynomialGrid`; the dimension is ``values.ndim``.
    mass : float or None, default 1
        Total mass of ``density``; ``None`` keeps the spline as given.
    interpolate : bool, default False
        Take ``values`` as samples at the cell centres and use the spline through
        them (one banded linear system per axis). Raises ``ValueError`` if that
        spline has a negative Bernstein coefficient (it may dip below zero).

    Notes
    -----
    ``values`` is kept as given; ``grid_shape`` and ``cell_volume`` are those of
    its cells, ``degree`` is ``continuity + 1``, ``integral`` and ``density`` are
    those of the Bernstein form. Everything is a linear map of ``values`` written
    with array-API operations: torch autograd and JAX differentiate through it.
    """

    _fields = PolynomialGrid._fields + ("_continuity", "_interpolate")
    _one_value_per_cell = True

    def __init__(self, values, continuity=1, domain=None, mass=1, interpolate=False):
        if isinstance(continuity, (bool, np.bool_)) or not isinstance(continuity, numbers.Integral):
            raise TypeError(f"continuity must be an integer >= 0, got {type(continuity).__name__} "
                            f"{continuity!r}")
        if continuity < 0:
            raise ValueError(f"continuity must be an integer >= 0, got {continuity}")
        if continuity + 1 > MAX_DEGREE:
            raise degree_error(continuity + 1)
        if not isinstance(interpolate, (bool, np.bool_)):
            raise TypeError(f"interpolate must be True or False, got {type(interpolate).__name__}")
        self._continuity, self._interpolate = int(continuity), bool(interpolate)
        super().__init__(values, domain, mass)
        if self._interpolate and self.degree > 1 and not is_tracer(self._values):
            self._check_interpolant()

    continuity = property(lambda self: self._continuity,
                          doc="Number of continuous derivatives of the spline.")
    interpolate = property(lambda self: self._interpolate,
                           doc="True if ``values`` are samples at the cell centres.")
    degree = property(lambda self: self._continuity + 1,
                      doc="Polynomial degree per axis, ``continuity + 1``.")

    @property
    def control_values(self):
        """The B-spline coefficients ``c``: ``values``, or those interpolating them."""
        if not self._interpolate:
            return self._values
        return _splines.control_values(namespace(self._values), self._values, self.degree)

    def as_polynomial_grid(self):
        """The spline as a :class:`PolynomialGrid` of degree ``p`` (exact).

        Its cells are the knot spans: ``grid_shape`` for even ``p``, twice as many
        per axis for odd ``p``; same ``domain`` and ``mass``.
        """
        xp, p = namespace(self._values), self.degree
        grid = object.__new__(PolynomialGrid)       # no validation: values may be traced
        grid._values = _splines.to_bernstein(xp, self.control_values, p)
        grid._lo, grid._hi, grid._mass, grid._native = self._lo, self._hi, self._mass, self._native
        grid._dim = self.dim
        return grid

    def bernstein_tangent(self, tangent):
        """The Bernstein coefficients (the layout of :meth:`as_polynomial_grid`) of a tangent
        of ``values``: the spline's linear map ``T`` (``A^{-1}`` per axis first with
        ``interpolate=True``) applied to ``tangent``, an array of the shape of ``values``."""
        xp, p = namespace(tangent), self.degree
        control = _splines.control_values(xp, tangent, p) if self._interpolate else tangent
        return _splines.to_bernstein(xp, control, p)

    def values_cotangent(self, cotangent):
        """The cotangent of ``values`` of a cotangent of the Bernstein coefficients: ``T^T``
        applied to ``cotangent`` (the transpose of :meth:`bernstein_tangent`)."""
        xp, p = namespace(cotangent), self.degree
        control = _splines.to_bernstein_transpose(xp, cotangent, p)
        return _splines.control_values_transpose(xp, control, p) if self._interpolate else control

    def with_dim(self, d):
        """The spline as a ``d``-dimensional :class:`PolynomialGrid` (:meth:`as_polynomial_grid`).

        Raises ``ValueError`` if ``values`` or ``domain`` do not have dimension ``d``.
        """
        return super().with_dim(d).as_polynomial_grid()

    integral = property(lambda self: self.as_polynomial_grid().integral,
                        doc="Integral of the spline given by ``values`` (0-d array).")
    density = property(lambda self: self.as_polynomial_grid().density,
                       doc="Bernstein coefficients of the spline rescaled to ``mass``.")

    def _check_interpolant(self):
        """Refuse an interpolating spline with a negative Bernstein coefficient.

        Coefficients >= 0 are what a :class:`PolynomialGrid` requires, and they imply
        ``S >= 0``. The message says where ``S`` is negative if a sample shows it
        (:func:`sdot._splines.lowest_sample`).
        """
        bern = self.as_polynomial_grid().values
        xp, (bern,) = _driver.checkable(bern)
        if _known(xp.min(bern) >= 0):
            return
        p = self.degree
        advice = ("use interpolate=False (the values as control values: never negative), smoother "
                  "samples, or a lower continuity")
        value, where = _splines.lowest_sample(xp, bern, self.dim, p)
        if not value < 0:
            raise ValueError(f"values: the interpolating spline of degree {p} has negative Bernstein "
                             f"coefficients (min {float(xp.min(bern)):.3g}), which a PolynomialGrid does "
                             f"not accept (it may dip below zero between the sampled points); {advice}")
        lo, hi = (_driver._to_host(b) for b in self.domain)
        x = np.array2string(lo + (hi - lo) * where, precision=4)
        raise ValueError(f"values: the interpolating spline of degree {p} dips below zero "
                         f"(S = {value:.3g} at x = {x}); {advice}")

    def __repr__(self):
        dom = "unit cube" if self._lo is None else "given"
        return (f"SplineGrid(grid_shape={self.grid_shape}, continuity={self._continuity}, "
                f"interpolate={self._interpolate}, domain={dom}, {_describe(self._values)}, "
                f"mass={self._mass!r})")
