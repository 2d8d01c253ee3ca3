"""Batches of grids: ``b`` densities of one grid class, a leading batch axis on ``values``.

The batching is generic: a batch class names its item class (``_item``: ``PolynomialGrid``,
later ``SplineGrid``), takes the item class's arguments, and holds one object of that class
whose batched fields (``values``, and ``domain`` when it has a batch axis) keep the leading
axis. Item ``i`` is that object with those fields indexed by ``i``; under ``jax.vmap`` the
same object is rebuilt from one item's arrays (:func:`sdot._batched.stacked`).
"""
from __future__ import annotations

import copy
import inspect

import numpy as np

from ._driver import namespace, to_array
from ._grids import PolynomialGrid, _domain
from ._spline_grid import SplineGrid
from ._measures import _Measure, _check_values, _describe, _is_native
from . import _measures

__all__ = ["BatchOfPolynomialGrid", "BatchOfSplineGrid"]


def _rank(x):
    return x.ndim if hasattr(x, "ndim") else np.ndim(x)


def _batched_domain(domain, values):
    """``(lo, hi)`` of shape ``(b, d)`` from a domain with a batch axis, each item checked
    and converted like a grid's domain; None if ``domain`` has no batch axis."""
    if domain is None:
        return None
    pair = isinstance(domain, (tuple, list)) and len(domain) == 2
    if not (pair and max(_rank(domain[0]), _rank(domain[1])) == 2) and not (
            not pair and _rank(domain) == 3):
        return None
    lo, hi = (x if hasattr(x, "ndim") else np.asarray(x, dtype=float) for x in domain)
    b = values.shape[0]
    if tuple(lo.shape) != tuple(hi.shape) or lo.shape[0] != b:
        raise ValueError(f"domain with a batch axis must be (lo, hi), each of shape (b, d) with b={b} "
                         f"(the batch size of values), got shapes {tuple(lo.shape)} and {tuple(hi.shape)}")
    items = [_domain((lo[i, ...], hi[i, ...]), values) for i in range(b)]
    xp = namespace(values)
    return xp.stack([c[0] for c in items]), xp.stack([c[1] for c in items])


class _BatchOfGrids(_Measure):
    """A batch of ``b`` grids of the class ``_item``, each normalised to its ``mass``.

    Parameters
    ----------
    values : array_like, shape (b, ...)
        A leading batch axis on the values of an item (finite, >= 0, no item all zero).
    *args, **kwargs
        The other arguments of the item class, shared by the items. ``domain`` may also
        have a batch axis: ``(lo, hi)`` each of shape ``(b, d)``.
    """

    _item = None                    # the class of the items (set by subclasses)
    _fields = ("_values",)          # ``align`` moves measures next to this array's framework

    def __init__(self, values, *args, **kwargs):
        native = _is_native(values)
        values = to_array(values, "values")
        if values.ndim < 2 or any(s == 0 for s in values.shape):
            raise ValueError(f"values must have a leading batch axis and the axes of one grid, non-empty, "
                             f"got shape {tuple(values.shape)}")
        arguments = inspect.signature(self._item).bind(values, *args, **kwargs).arguments
        domain = _batched_domain(arguments.get("domain"), values)
        first = dict(arguments, values=values[0, ...])
        if domain is not None:
            first["domain"] = (domain[0][0, ...], domain[1][0, ...])
        stacked = self._item(**first)       # the item class checks shapes, domain, mass, options
        xp = namespace(values)
        _check_values(xp.reshape(values, (values.shape[0], -1)), "values", nonzero_axis=-1)
        stacked._values, stacked._native = values, native
        fields = ("_values",)
        if domain is not None:
            (stacked._lo, stacked._hi), fields = domain, ("_values", "_lo", "_hi")
        self._stacked, self._batch_fields, self._ndim = stacked, fields, values.ndim

    # ------------------------------------------------------------ pytree
    def _tree_flatten(self):
        children, aux = self._stacked._tree_flatten()
        return children, (type(self._stacked), aux, self._batch_fields, self._ndim)

    @classmethod
    def _tree_unflatten(cls, aux_data, children):
        item_cls, aux, fields, ndim = aux_data
        obj = object.__new__(cls)
        obj._stacked, obj._batch_fields, obj._ndim = item_cls._tree_unflatten(aux, children), fields, ndim
        return obj

    def stacked(self):
        """``(item, fields)``: an item-class object whose ``fields`` keep the batch axis."""
        return self._stacked, self._batch_fields

    # -------------------------------------------------------- properties
    _values = property(lambda self: self._stacked._values)
    values = property(lambda self: self._stacked._values, doc="The values as given, ``(b, ...)``.")
    mass = property(lambda self: self._stacked.mass, doc="The mass of each item.")
    native = property(lambda self: self._stacked.native,
                      doc="True if the inputs came with a framework of their own (rule 1).")
    batched = property(lambda self: self._stacked._values.ndim == self._ndim,
                       doc="True if there is a leading batch axis (False inside jax.vmap).")

    def _one(self):
        """An item: the first, or the grid itself without its batch axis (inside ``jax.vmap``)."""
        return self[0] if self.batched else self._stacked

    @property
    def dim(self):
        """Dimension d of each item."""
        return self._one().dim

    @property
    def domain(self):
        """``(lo, hi)``: each ``(d,)`` if shared, ``(b, d)`` if the domain has a batch axis."""
        if "_lo" in self._batch_fields and self.batched:
            return self._stacked._lo, self._stacked._hi
        return self._one().domain

    @property
    def density(self):
        """The items' densities, each rescaled to ``mass``, stacked: ``(b, ...)``."""
        if not self.batched:
            return self._stacked.density
        items = [item.density for item in self]
        return namespace(*items).stack(items)

    def with_dim(self, d):
        """The batch with items read as ``d``-dimensional densities (see ``PolynomialGrid.with_dim``)."""
        if not self.batched:
            return self._stacked.with_dim(d)
        stacked = self[0].with_dim(d)
        for f in self._batch_fields:
            setattr(stacked, f, getattr(self._stacked, f))
        out = copy.copy(self)
        out._stacked = stacked
        return out

    def __len__(self):
        if not self.batched:
            raise TypeError(f"{type(self).__name__} is not a batch here (inside jax.vmap its items are mapped)")
        return self._stacked._values.shape[0]

    def __bool__(self):
        return True

    def __getitem__(self, i):
        """Item ``i``, an object of the item class (no re-validation)."""
        i = _measures._item_index(len(self), i)
        item = copy.copy(self._stacked)
        for f in self._batch_fields:
            setattr(item, f, getattr(self._stacked, f)[i, ...])
        return item

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __repr__(self):
        if not self.batched:
            return f"{type(self).__name__}(item: {self._stacked!r})"
        item = self[0]
        dom = "per item" if "_lo" in self._batch_fields else "unit cube" if item._lo is None else "given"
        return (f"{type(self).__name__}(b={len(self)}, grid_shape={item.grid_shape}, degree={item.degree}, "
                f"domain={dom}, {_describe(self._values)}, mass={self.mass!r})")


class BatchOfPolynomialGrid(_BatchOfGrids):
    """A batch of ``b`` :class:`PolynomialGrid` densities: ``values`` ``(b, n0, ..., [(p+1)^d])``.

    Parameters
    ----------
    values : array_like
        ``values[i]`` are the values of item ``i`` (see :class:`PolynomialGrid`).
    domain : pair (lo, hi), optional
        Shared by the items (scalars or shape ``(d,)``), or one per item: ``lo`` and ``hi``
        of shape ``(b, d)``.
    mass : float or None, default 1
        Total mass of each item.

    Notes
    -----
    Indexing gives a :class:`PolynomialGrid`. Paired with a batch of sources item by item,
    or with one source (broadcast), every function returns one result per item.
    """

    _item = PolynomialGrid

    def __init__(self, values, domain=None, mass=1):
        super().__init__(values, domain=domain, mass=mass)


class BatchOfSplineGrid(_BatchOfGrids):
    """A batch of ``b`` :class:`SplineGrid` densities: control ``values`` ``(b, n0, ...)``.

    Parameters
    ----------
    values : array_like
        ``values[i]`` are the control values of item ``i`` (see :class:`SplineGrid`).
    continuity, domain, mass, interpolate : optional
        As for :class:`SplineGrid`, shared by the items (``domain`` may also be one per item:
        ``lo`` and ``hi`` of shape ``(b, d)``; ``mass`` is each item's).

    Notes
    -----
    Indexing gives a :class:`SplineGrid`; pairing and broadcasting as for
    :class:`BatchOfPolynomialGrid`.
    """

    _item = SplineGrid

    def __init__(self, values, continuity=1, domain=None, mass=1, interpolate=False):
        super().__init__(values, continuity=continuity, domain=domain, mass=mass, interpolate=interpolate)
