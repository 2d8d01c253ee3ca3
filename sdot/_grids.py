"""Densities on regular grids: ``PolynomialGrid`` and ``Grid``."""
from __future__ import annotations

import numpy as np

from . import _driver
from ._driver import device_of, is_tracer, namespace, to_array
from ._measures import (_Measure, _check_mass, _check_values, _describe, _is_array, _is_native,
                        _known)

__all__ = ["PolynomialGrid", "Grid"]


#: The largest polynomial degree per axis: beyond it the integrals of the Bernstein pieces
#: over the cells lose digits in FP64 (the cells' masses of a spline of degree 21 summed to
#: 1 within 3e-11 only, of degree 23 within 1e-9: more than the solver's tolerance).
MAX_DEGREE = 17


def degree_error(p):
    """The ``ValueError`` of a degree ``p`` above :data:`MAX_DEGREE`."""
    return ValueError(f"degree {p} per axis: the largest supported degree is {MAX_DEGREE} (SplineGrid: "
                      f"continuity {MAX_DEGREE - 1}); beyond it the integrals over the cells lose digits in "
                      "FP64 (cell masses off by 1e-9 at degree 23), and the cost grows as (degree + 1)^d per cell")


def _degree(shape, d, one_value_per_cell):
    """Polynomial degree per axis of ``values`` of ``shape`` for dimension ``d``."""
    if len(shape) == d:
        return 0
    if len(shape) == d + 1 and not one_value_per_cell:
        k, p = shape[-1], 0
        while (p + 1) ** d < k:
            p += 1
        if (p + 1) ** d == k:
            if p > MAX_DEGREE:
                raise degree_error(p)
            return p
        raise ValueError(f"values: the last axis must hold (p+1)^{d} Bernstein coefficients "
                         f"per cell, got {k}")
    expected = f"{d} axes" if one_value_per_cell else f"{d} or {d + 1} axes"
    raise ValueError(f"values must have {expected} for a {d}-dimensional grid, got shape "
                     f"{tuple(shape)} (dimension mismatch between source and target?)")


def _bound(b, values):
    """One corner of the domain: a native array cast to ``values.dtype``, or NumPy."""
    if _is_native(b) and _is_native(values) and not _driver.same_framework(b, values):
        namespace(b, values)            # torch and JAX in one call: a TypeError that names both
    if _is_native(b) and _driver.same_framework(b, values):
        return b if b.dtype == values.dtype else namespace(b).astype(b, values.dtype)
    host = _driver._to_host(b) if _is_native(b) else np.asarray(b)
    if host.dtype.kind not in "biuf":
        raise TypeError(f"domain: expected numbers, got {host.dtype}")
    return host.astype(np.float64)


def _domain(domain, values):
    """``(lo, hi)`` arrays of shape () or (d,), or ``(None, None)`` for the unit cube."""
    if domain is None:
        return None, None
    if not isinstance(domain, (tuple, list)):
        if not _is_array(domain):
            raise TypeError(f"domain must be None or a pair (lo, hi), got {type(domain).__name__}")
        if domain.ndim not in (1, 2) or domain.shape[0] != 2:
            raise ValueError(f"domain must have shape (2,) or (2, d), got {tuple(domain.shape)}")
    elif len(domain) != 2:
        raise ValueError(f"domain must be a pair (lo, hi), got {len(domain)} entries")
    lo, hi = _bound(domain[0], values), _bound(domain[1], values)
    if lo.ndim > 1 or hi.ndim > 1 or (lo.ndim == hi.ndim == 1 and lo.shape != hi.shape):
        raise ValueError("domain must be (lo, hi) with lo and hi scalars or of shape (d,), got "
                         f"shapes {tuple(lo.shape)} and {tuple(hi.shape)}")
    for x in (lo, hi):
        _check_values(x, "domain", nonneg=False)
    on_host = isinstance(lo, np.ndarray) and isinstance(hi, np.ndarray)
    ordered = bool(np.all(hi > lo)) if on_host else None  # before tracing can hide values
    with np.errstate(over="ignore"):
        if on_host and not np.all(np.isfinite(hi - lo)):
            raise ValueError("domain: hi - lo overflows (the domain is wider than the dtype represents); "
                             "rescale the problem")
    xp = namespace(values)
    lo, hi = xp.broadcast_arrays(*(
        xp.asarray(x, dtype=values.dtype, device=device_of(values))
        if isinstance(x, np.ndarray) else x for x in (lo, hi)))
    if ordered is None and not (is_tracer(lo) or is_tracer(hi)):
        ordered = _known(xp.all(hi > lo))
    if ordered is False:
        raise ValueError("domain: every upper bound must be greater than the lower bound "
                         "(the domain has zero or negative volume)")
    return lo, hi


class PolynomialGrid(_Measure):
    """A density on a regular grid over ``domain`` (default the unit cube).

    Parameters
    ----------
    values : array_like
        ``values.ndim == d``: one constant per cell; ``values[i0, i1, ...]`` is
        the cell ``[i0/n0, (i0+1)/n0] x [i1/n1, ...]`` of the domain.
        ``values.ndim == d + 1``: the last axis holds the ``(p+1)^d`` Bernstein
        coefficients (C order) of a polynomial of degree ``p <= 17`` per axis on each
        cell. Must be finite, >= 0 and not all zero.
    domain : pair (lo, hi), optional
        Lower and upper corners, scalars or of shape ``(d,)``.
    mass : float or None, default 1
        Total mass of ``density``; ``None`` keeps ``values`` as given.

    Notes
    -----
    The grid alone does not know ``d`` when ``domain`` has scalar bounds or is
    None: it then assumes one value per cell (``d = values.ndim``). The solver
    calls :meth:`with_dim` with the dimension of the source to interpret
    ``values`` (e.g. ``values`` of shape ``(16, 16, 4)`` paired with 2-d Diracs
    is a degree-1 polynomial per cell).
    """

    _fields = ("_values", "_lo", "_hi", "_dim", "_mass", "_native")
    _one_value_per_cell = False

    def __init__(self, values, domain=None, mass=1):
        native = _is_native(values)
        values = to_array(values, "values")
        if values.ndim < 1 or any(s == 0 for s in values.shape):
            raise ValueError(f"values must be a non-empty array with at least one axis, got "
                             f"shape {tuple(values.shape)}")
        self._lo, self._hi = _domain(domain, values)
        self._dim = None if self._lo is None or self._lo.ndim == 0 else self._lo.shape[0]
        self._values, self._mass, self._native = values, _check_mass(mass), native
        _degree(values.shape, self.dim, self._one_value_per_cell)
        _check_values(values, "values", nonzero_axis=None)

    def with_dim(self, d):
        """This grid read as a ``d``-dimensional density (the dimension of the source).

        Raises ``ValueError`` if ``values`` or ``domain`` do not fit dimension ``d``.
        """
        if self._dim is not None and self._dim != d:
            raise ValueError(f"dimension mismatch: the domain of the grid has dimension "
                             f"{self._dim}, the source has dimension {d}")
        _degree(self._values.shape, d, self._one_value_per_cell)
        children, aux = self._tree_flatten()
        grid = self._tree_unflatten(aux, children)
        grid._dim = d
        return grid

    values = property(lambda self: self._values, doc="The values as given.")
    dim = property(lambda self: self._values.ndim if self._dim is None else self._dim,
                   doc="Dimension d (``values.ndim`` unless set by ``domain``/``with_dim``).")
    degree = property(lambda self: _degree(self._values.shape, self.dim,
                                           self._one_value_per_cell),
                      doc="Polynomial degree per axis (0: one value per cell).")
    grid_shape = property(lambda self: tuple(self._values.shape[:self.dim]),
                          doc="Number of cells along each axis.")

    @property
    def domain(self):
        """``(lo, hi)``: arrays of shape ``(d,)``, namespace and dtype of ``values``."""
        xp, v, d = namespace(self._values), self._values, self.dim
        if self._lo is None:
            return (xp.zeros((d,), dtype=v.dtype, device=device_of(v)),
                    xp.ones((d,), dtype=v.dtype, device=device_of(v)))
        return xp.broadcast_to(self._lo, (d,)), xp.broadcast_to(self._hi, (d,))

    @property
    def cell_volume(self):
        """Volume of one grid cell (0-d array)."""
        xp, (lo, hi) = namespace(self._values), self.domain
        n = xp.asarray(self.grid_shape, dtype=lo.dtype, device=device_of(lo))
        return xp.prod((hi - lo) / n)

    @property
    def integral(self):
        """Integral of the density given by ``values`` as given (0-d array)."""
        xp = namespace(self._values)
        per_cell = (self.degree + 1) ** self.dim
        return xp.sum(self._values) * (self.cell_volume / per_cell)

    @property
    def density(self):
        """``values`` rescaled so that the density integrates to ``mass``."""
        if self._mass is None:
            return self._values
        return self._values * (self._mass / self.integral)

    def __repr__(self):
        dom = "unit cube" if self._lo is None else "given"
        return (f"{type(self).__name__}(grid_shape={self.grid_shape}, degree={self.degree}, "
                f"domain={dom}, {_describe(self._values)}, mass={self._mass!r})")


class Grid(PolynomialGrid):
    """A density with one constant value per grid cell (``values.ndim == d``).

    Same parameters as :class:`PolynomialGrid`.
    """

    _one_value_per_cell = True
