"""Measures: sums of Diracs and densities on grids.

A measure stores the arrays it was given (converted by ``_driver.to_array``)
and normalises them on demand (``masses``, ``density``) with plain operations
of the arrays' own namespace, so torch autograd and JAX differentiate through
the normalisation. Measures are JAX pytrees; constructing one never solves.
"""
from __future__ import annotations

import math
import numbers
import operator
import sys

import array_api_compat as aac
import numpy as np

from . import _driver
from ._driver import device_of, is_tracer, namespace, to_array

__all__ = ["align", "SumOfDiracs", "SumOfWeightedDiracs", "BatchOfSumOfDiracs",
           "BatchOfSumOfWeightedDiracs", "SumOfDiracs1d", "PolynomialGrid", "Grid"]


# -------------------------------------------------------------- validation
def _is_array(x):
    return aac.is_array_api_obj(x)


def _known(flag):
    """``bool(flag)``, or True when the value is not concrete (skip the check)."""
    try:
        return bool(flag)
    except Exception:  # traced by torch.func / jax: values unknown
        return True


def _check_values(x, name, *, nonneg=True, nonzero_axis=False):
    """NaN/inf, negative and all-zero checks; skipped for JAX tracers.

    ``nonzero_axis``: False (no check), None (not all zero) or -1 (no all-zero row).
    """
    if is_tracer(x):
        return
    xp = namespace(x)
    if not _known(xp.all(xp.isfinite(x))):
        raise ValueError(f"{name} contains NaN or infinite values")
    if nonneg and not _known(xp.all(x >= 0)):
        raise ValueError(f"{name} must be >= 0, found a negative value")
    if nonzero_axis is not False and not _known(xp.all(xp.any(x != 0, axis=nonzero_axis))):
        where = " (in at least one batch item)" if x.ndim > 1 and nonzero_axis == -1 else ""
        raise ValueError(f"{name} are all zero{where}: the total mass must be > 0")


def _check_mass(mass):
    """``None``, a finite float > 0, or a 0-d framework array (kept, differentiable)."""
    if mass is None:
        return None
    if isinstance(mass, bool) or not (isinstance(mass, numbers.Real) or _is_array(mass)):
        raise TypeError(f"mass must be None or a positive number, got {type(mass).__name__}")
    if aac.is_numpy_array(mass) or isinstance(mass, numbers.Real):
        if np.ndim(mass) != 0 or np.asarray(mass).dtype.kind not in "biuf":
            raise ValueError(f"mass must be a scalar, got shape {np.shape(mass)}")
        mass = float(mass)
        if not (math.isfinite(mass) and mass > 0):
            raise ValueError(f"mass must be a finite number > 0, got {mass}")
        return mass
    if mass.ndim != 0:
        raise ValueError(f"mass must be a scalar, got shape {tuple(mass.shape)}")
    if not is_tracer(mass):
        xp = namespace(mass)
        if not _known(xp.isfinite(mass) & (mass > 0)):
            raise ValueError("mass must be a finite number > 0")
    return mass


def _check_shape(x, name, ndim, what):
    if x.ndim != ndim:
        raise ValueError(f"{name} must have shape {what}, got shape {tuple(x.shape)}")
    if any(s == 0 for s in x.shape):
        raise ValueError(f"{name} must not be empty, got shape {tuple(x.shape)}")


def _is_native(x):
    """True for arrays with a framework of their own (not NumPy, lists, scalars)."""
    return _is_array(x) and not aac.is_numpy_array(x)


def _describe(x):
    framework = ("torch" if aac.is_torch_array(x) else "jax" if aac.is_jax_array(x)
                 else type(x).__module__.split(".")[0])
    return f"dtype={str(x.dtype).replace('torch.', '')}, framework={framework}"


# ------------------------------------------------------------------ pytrees
class _Measure:
    """Common machinery: pytree flattening, mass setting."""

    _fields: tuple = ()

    def _tree_flatten(self):
        values = [getattr(self, f) for f in self._fields]
        is_leaf = tuple(_is_array(v) for v in values)
        children = tuple(v for v, leaf in zip(values, is_leaf) if leaf)
        aux = tuple(None if leaf else v for v, leaf in zip(values, is_leaf))
        return children, (is_leaf, aux)

    @classmethod
    def _tree_unflatten(cls, aux_data, children):
        is_leaf, aux = aux_data
        obj = object.__new__(cls)  # no validation: children may be tracers
        children = iter(children)
        for field, leaf, value in zip(cls._fields, is_leaf, aux):
            setattr(obj, field, next(children) if leaf else value)
        return obj

    def astype(self, dtype):
        """A copy whose floating arrays are cast to ``dtype`` (no re-validation).

        The solver normalises the cast copy, so that normalised masses and
        densities are exact in the computation dtype.
        """
        children, aux = self._tree_flatten()
        xp = namespace(*children)
        cast = [xp.astype(c, dtype) if xp.isdtype(c.dtype, "real floating") else c for c in children]
        return self._tree_unflatten(aux, cast)

    @property
    def mass(self):
        """The mass setting: 1 by default, ``None`` (as given) or ``m``."""
        return self._mass

    @property
    def native(self):
        """True if the inputs came with a framework of their own (rule 1)."""
        return self._native


def _register_pytrees():
    """Register every measure class as a JAX pytree (idempotent)."""
    if _registered:
        return
    import jax

    for cls in _CLASSES:
        jax.tree_util.register_pytree_node(cls, cls._tree_flatten, cls._tree_unflatten)
    _registered.append(True)


_registered = []


def align(*measures):
    """The measures, those built from NumPy/lists moved next to the native ones.

    Rule 1 beats rule 2: when some measures came with torch or JAX arrays, the
    arrays that sdot converted from NumPy or lists for the others are moved to
    that framework and device (``None`` entries pass through).

    Raises
    ------
    TypeError
        If the native measures mix torch and JAX.
    """
    refs = [getattr(m, m._fields[0]) for m in measures if m is not None and m.native]
    if not refs:
        return measures
    namespace(*refs)
    out = []
    for m in measures:
        if m is not None and not m.native:
            children, aux = m._tree_flatten()
            m = m._tree_unflatten(aux, [_driver.convert_like(c, refs[0]) for c in children])
        out.append(m)
    return tuple(out)


# -------------------------------------------------------------- Dirac sums
class _Diracs(_Measure):
    _fields = ("_positions", "_weights", "_mass", "_native")
    _batched = False

    def __init__(self, positions, weights=None, mass=1, native=None):
        native = _is_native(positions) if native is None else native
        weights_native = _is_native(weights)
        positions = to_array(positions, "positions")
        shape = "(b, n, d)" if self._batched else "(n, d)"
        _check_shape(positions, "positions", 3 if self._batched else 2, shape)
        if weights is not None:
            weights = to_array(weights, "weights")
            if native and not weights_native:    # numpy weights follow torch/JAX positions
                weights = _driver.convert_like(weights, positions)
            elif weights_native and not native:
                positions, native = _driver.convert_like(positions, weights), True
            namespace(positions, weights)
            expected = tuple(positions.shape[:-1])
            if tuple(weights.shape) != expected:
                raise ValueError(f"weights must have shape {expected} (one per Dirac of "
                                 f"positions {tuple(positions.shape)}), got {tuple(weights.shape)}")
        mass = _check_mass(mass)
        _check_values(positions, "positions", nonneg=False)
        if weights is not None:
            _check_values(weights, "weights", nonzero_axis=-1)
        self._positions, self._weights, self._mass = positions, weights, mass
        self._native = native

    @property
    def positions(self):
        """Positions of the Diracs, ``(n, d)`` or ``(b, n, d)``."""
        return self._positions

    @property
    def weights(self):
        """Raw masses as given, ``(n,)`` or ``(b, n)`` (ones when unweighted)."""
        if self._weights is not None:
            return self._weights
        xp, x = namespace(self._positions), self._positions
        return xp.ones(tuple(x.shape[:-1]), dtype=x.dtype, device=device_of(x))

    @property
    def masses(self):
        """Normalised masses: ``weights * mass / sum(weights)`` along the last axis.

        With ``mass=None`` the weights as given.
        """
        w = self.weights
        if self._mass is None:
            return w
        xp = namespace(w)
        return w * (self._mass / xp.sum(w, axis=-1, keepdims=True))

    dim = property(lambda self: self._positions.shape[-1], doc="Dimension d of the space.")
    n = property(lambda self: self._positions.shape[-2], doc="Number of Diracs (per item).")
    batched = property(lambda self: self._positions.ndim == 3,
                       doc="True if there is a leading batch axis (False inside jax.vmap).")

    def __len__(self):
        if not self.batched:
            raise TypeError(f"{type(self).__name__} is not a batch")
        return self._positions.shape[0]

    def __bool__(self):
        return True

    def __getitem__(self, i):
        """Item ``i`` of a batch, as an unbatched measure (no re-validation)."""
        b, i = len(self), operator.index(i)
        if not -b <= i < b:
            raise IndexError(f"index {i} is out of range for a batch of {b} items")
        item = object.__new__(_UNBATCHED[type(self)])
        item._positions = self._positions[i, ...]
        item._weights = None if self._weights is None else self._weights[i, ...]
        item._mass, item._native = self._mass, self._native
        return item

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __repr__(self):
        b = f"b={self._positions.shape[0]}, " if self.batched else ""
        return (f"{type(self).__name__}({b}n={self.n}, d={self.dim}, "
                f"{_describe(self._positions)}, mass={self._mass!r})")


class SumOfDiracs(_Diracs):
    """``n`` Diracs of equal mass at ``positions`` ``(n, d)``.

    Parameters
    ----------
    positions : array_like, shape (n, d)
    mass : float or None, default 1
        Total mass; ``None`` keeps mass 1 per Dirac.
    """

    def __init__(self, positions, mass=1):
        super().__init__(positions, None, mass)


class SumOfWeightedDiracs(_Diracs):
    """Diracs at ``positions`` ``(n, d)`` with masses ``weights`` ``(n,)`` >= 0.

    Parameters
    ----------
    positions : array_like, shape (n, d)
    weights : array_like, shape (n,)
        Non-negative, not all zero.
    mass : float or None, default 1
        Total mass after normalisation; ``None`` keeps ``weights`` as given.
    """

    def __init__(self, positions, weights, mass=1):
        super().__init__(positions, weights, mass)


class BatchOfSumOfDiracs(_Diracs):
    """A batch of ``b`` sums of ``n`` equal Diracs, ``positions`` ``(b, n, d)``.

    Each item is normalised to ``mass``. Indexing gives a :class:`SumOfDiracs`.
    """

    _batched = True

    def __init__(self, positions, mass=1):
        super().__init__(positions, None, mass)


class BatchOfSumOfWeightedDiracs(_Diracs):
    """A batch of weighted Dirac sums: ``positions`` ``(b, n, d)``, ``weights`` ``(b, n)``.

    Each item is normalised to ``mass``. Indexing gives a :class:`SumOfWeightedDiracs`.
    """

    _batched = True

    def __init__(self, positions, weights, mass=1):
        super().__init__(positions, weights, mass)


class SumOfDiracs1d(SumOfDiracs):
    """Equal Diracs on a line: ``positions`` ``(n,)``, stored as ``(n, 1)``."""

    def __init__(self, positions, mass=1):
        native = _is_native(positions)
        positions = to_array(positions, "positions")
        _check_shape(positions, "positions", 1, "(n,)")
        positions = namespace(positions).expand_dims(positions, axis=1)
        _Diracs.__init__(self, positions, None, mass, native=native)


_UNBATCHED = {BatchOfSumOfDiracs: SumOfDiracs, BatchOfSumOfWeightedDiracs: SumOfWeightedDiracs}


# ------------------------------------------------------------ grid densities
def _degree(shape, d, one_value_per_cell):
    """Polynomial degree per axis of ``values`` of ``shape`` for dimension ``d``."""
    if len(shape) == d:
        return 0
    if len(shape) == d + 1 and not one_value_per_cell:
        k, p = shape[-1], 0
        while (p + 1) ** d < k:
            p += 1
        if (p + 1) ** d == k:
            return p
        raise ValueError(f"values: the last axis must hold (p+1)^{d} Bernstein coefficients "
                         f"per cell, got {k}")
    expected = f"{d} axes" if one_value_per_cell else f"{d} or {d + 1} axes"
    raise ValueError(f"values must have {expected} for a {d}-dimensional grid, got shape "
                     f"{tuple(shape)} (dimension mismatch between source and target?)")


def _bound(b, values):
    """One corner of the domain: a native array cast to ``values.dtype``, or NumPy."""
    if _is_native(b) and type(b) is type(values):
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
        coefficients (C order) of a polynomial of degree ``p`` per axis on each
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


_CLASSES = (SumOfDiracs, SumOfWeightedDiracs, BatchOfSumOfDiracs, BatchOfSumOfWeightedDiracs,
            SumOfDiracs1d, PolynomialGrid, Grid)
_driver._jax_hooks.append(_register_pytrees)
if "jax" in sys.modules:
    _register_pytrees()
