"""Measures: the common machinery, and sums of Diracs (grids are in ``_grids``).

A measure stores the arrays it was given (converted by ``_driver.to_array``)
and normalises them on demand (``masses``, ``density``) with plain operations
of the arrays' own namespace, so torch autograd and JAX differentiate through
the normalisation. Measures are JAX pytrees; constructing one never solves.
"""
from __future__ import annotations

import math
import numbers
import operator

import array_api_compat as aac
import numpy as np

from . import _driver
from ._driver import device_of, is_tracer, namespace, to_array
from ._pytrees import JaxPytree

__all__ = ["align", "SumOfDiracs", "SumOfWeightedDiracs", "BatchOfSumOfDiracs",
           "BatchOfSumOfWeightedDiracs", "SumOfDiracs1d"]


# -------------------------------------------------------------- validation
def _is_array(x):
    return aac.is_array_api_obj(x)


def _known(flag):
    """``bool(flag)``, or True when the value is not concrete (skip the check)."""
    try:
        return bool(flag)
    except Exception:  # traced by torch.func / jax: values unknown
        return True


def _concrete_jax(x):
    return aac.is_jax_array(x) and not is_tracer(x)


def _check_values(x, name, *, nonneg=True, nonzero_axis=False):
    """NaN/inf, negative and all-zero checks; skipped for JAX tracers.

    ``nonzero_axis``: False (no check), None (not all zero) or -1 (no all-zero row).
    """
    if is_tracer(x):
        return
    xp, (x,) = _driver.checkable(x)
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
        xp, (value,) = _driver.checkable(mass)
        if not _known(xp.isfinite(value) & (value > 0)):
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
class _Measure(JaxPytree):
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
        if _concrete_jax(x):                    # from the host: JAX would compile per shape
            return _driver.convert_like(np.ones(x.shape[:-1], dtype=x.dtype), x)
        return xp.ones(tuple(x.shape[:-1]), dtype=x.dtype, device=device_of(x))

    @property
    def masses(self):
        """Normalised masses: ``weights * mass / sum(weights)`` along the last axis.

        With ``mass=None`` the weights as given.
        """
        w = self.weights
        if self._mass is None:
            return w
        if self._weights is None and isinstance(self._mass, float) and _concrete_jax(w):
            return _driver.convert_like(np.full(w.shape, self._mass / w.shape[-1], dtype=w.dtype), w)
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
        i = _item_index(len(self), i)
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


def _item_index(b, i):
    """``i`` as an index into a batch of ``b`` items (negative from the end), or IndexError."""
    i = operator.index(i)
    if not -b <= i < b:
        raise IndexError(f"index {i} is out of range for a batch of {b} items")
    return i
