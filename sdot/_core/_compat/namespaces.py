"""The array-API namespace the solver computes with.

array_api_compat's, except for the calls the kernels make most, which go to torch or NumPy
directly (:class:`_TorchDirect`, :class:`_NumpyDirect`; same results bit for bit): there
array_api_compat only adds argument handling to every call (on torch a pass over the indices
for negative ones, which sdot never takes, dtype promotions, a tensor per Python scalar, a
cast of ``any``'s result; on NumPy the inspection of each argument, wrappers of the array
methods). On JAX the gathers (:class:`_JaxDirect`) skip what a traced program would carry for
indices sdot never takes (negative, beyond the bounds).
"""
from __future__ import annotations

import array_api_compat as aac
import array_api_compat.numpy as aac_numpy
import numpy as np

#: The one switch: the direct namespaces below, or array_api_compat's as they are
#: (``sdot.driver.direct_namespaces``, ``$SDOT_DIRECT_NAMESPACES``: e.g. to rule them out when
#: chasing a bug).
DIRECT = True


def namespace(*arrays):
    """The namespace of ``arrays`` (as :func:`array_api_compat.array_namespace`)."""
    if not DIRECT:
        return aac.array_namespace(*arrays)
    if arrays and all(type(a) is np.ndarray for a in arrays):
        return _numpy_direct
    if _torch_direct and all(map(aac.is_torch_array, arrays)):
        return _torch_direct[0]
    xp = aac.array_namespace(*arrays)
    if not any(map(aac.is_torch_array, arrays)):
        if aac.is_jax_namespace(xp):
            if not _jax_direct:
                _jax_direct.append(_JaxDirect(xp))
            return _jax_direct[0]
        return xp
    if not _torch_direct:
        _torch_direct.append(_TorchDirect(xp))
    return _torch_direct[0]


_torch_direct = []          # made on first use: torch is imported only if the inputs hold tensors
_jax_direct = []


def _on_cpu(device):
    if device is not None and device != "cpu":
        raise ValueError(f"Unsupported device {device!r}: NumPy arrays are on the cpu")


class _Direct:
    """A framework's array_api_compat namespace ``base``, with the subclass's own
    functions in place of some of its names."""

    def __init__(self, base):
        # base's names as plain attributes: a __getattr__ per lookup would cost the gain
        self.__dict__.update({name: getattr(base, name) for name in dir(base)
                              if not name.startswith("__") and name not in type(self).__dict__})
        self._base, self.__name__ = base, base.__name__


def _take_axis(x, axis):
    """The axis of ``take(x, indices, axis=axis)`` (the array API's: none only for 1-D ``x``)."""
    if axis is None:
        if x.ndim != 1:
            raise ValueError("axis must be specified when ndim > 1")
        return 0
    return axis


def _reduction(name):
    """The array method ``name`` as an array-API reduction ``f(x, /, *, axis, keepdims)``."""
    def reduce(x, /, *, axis=None, keepdims=False):
        return getattr(x, name)(axis=axis, keepdims=keepdims)
    reduce.__name__ = name
    return staticmethod(reduce)


class _NumpyDirect(_Direct):
    """array_api_compat's NumPy namespace, with the array methods or NumPy's functions
    for ``reshape`` and ``asarray`` (without ``copy``), ``take``, ``arange``, ``zeros``,
    ``ones``, ``full``, ``astype``, ``nonzero``, ``sum``, ``max``, ``min``, ``any``,
    ``all`` and ``argmax`` (same semantics: array_api_compat's versions only add argument
    handling, NumPy's module-level ones a dispatch to the method); other names are
    array_api_compat's."""

    def reshape(self, x, /, shape, *, copy=None):
        return x.reshape(shape) if copy is None else self._base.reshape(x, shape, copy=copy)

    def asarray(self, obj, /, *, dtype=None, device=None, copy=None):
        if copy is not None:
            return self._base.asarray(obj, dtype=dtype, device=device, copy=copy)
        _on_cpu(device)
        return np.asarray(obj, dtype=dtype)

    @staticmethod
    def take(x, indices, /, *, axis=None):
        return x.take(indices) if axis is None else x.take(indices, axis=axis)

    @staticmethod
    def arange(start, /, stop=None, step=1, *, dtype=None, device=None):
        _on_cpu(device)
        return np.arange(start, dtype=dtype) if stop is None else np.arange(start, stop, step, dtype=dtype)

    @staticmethod
    def zeros(shape, *, dtype=None, device=None):
        _on_cpu(device)
        return np.zeros(shape, dtype=dtype)

    @staticmethod
    def ones(shape, *, dtype=None, device=None):
        _on_cpu(device)
        return np.ones(shape, dtype=dtype)

    @staticmethod
    def full(shape, fill_value, *, dtype=None, device=None):
        _on_cpu(device)
        return np.full(shape, fill_value, dtype=dtype)

    @staticmethod
    def astype(x, dtype, /, *, copy=True, device=None):
        _on_cpu(device)
        return x.astype(dtype, copy=copy)

    @staticmethod
    def nonzero(x, /):
        return x.nonzero()

    @staticmethod
    def sum(x, /, *, axis=None, dtype=None, keepdims=False):
        return x.sum(axis=axis, dtype=dtype, keepdims=keepdims)

    max, min, any, all, argmax = (_reduction(name) for name in ("max", "min", "any", "all", "argmax"))


_numpy_direct = _NumpyDirect(aac_numpy)


class _TorchDirect(_Direct):
    """array_api_compat's torch namespace, with direct ``take``, ``take_along_axis``
    and ``where`` (non-negative indices; ``where`` of tensors of one dtype, or of a
    tensor and a Python scalar), ``maximum`` and ``minimum`` (of one dtype, or a clamp
    by a Python scalar of the tensor's kind), ``any`` of a boolean tensor and ``reshape``;
    other cases go to array_api_compat."""

    @staticmethod
    def take(x, indices, /, *, axis=None):
        import torch

        return torch.index_select(x, _take_axis(x, axis), indices)

    @staticmethod
    def take_along_axis(x, indices, /, *, axis=-1):
        import torch

        return torch.take_along_dim(x, indices, dim=axis)

    def where(self, condition, x1, x2, /):
        import torch

        if isinstance(x1, torch.Tensor) and isinstance(x2, torch.Tensor) and x1.dtype != x2.dtype:
            return self._base.where(condition, x1, x2)      # array-API promotion
        return torch.where(condition, x1, x2)

    def maximum(self, x1, x2, /):
        return self._extremum(x1, x2, "min", self._base.maximum)

    def minimum(self, x1, x2, /):
        return self._extremum(x1, x2, "max", self._base.minimum)

    @staticmethod
    def _extremum(x1, x2, bound, fallback):
        """``maximum`` (``bound="min"``) or ``minimum`` (``"max"``) of tensors of one dtype,
        or of a tensor and a Python scalar of its kind (a clamp); else ``fallback``."""
        import torch

        if isinstance(x1, (int, float)) and not isinstance(x1, bool):
            x1, x2 = x2, x1
        if isinstance(x1, torch.Tensor):
            if isinstance(x2, torch.Tensor):
                if x1.dtype == x2.dtype:
                    return torch.maximum(x1, x2) if bound == "min" else torch.minimum(x1, x2)
            elif (isinstance(x2, int) and not isinstance(x2, bool)) or (
                    isinstance(x2, float) and x1.is_floating_point()):
                return torch.clamp(x1, **{bound: x2})
        return fallback(x1, x2)

    def any(self, x, /, *, axis=None, keepdims=False):
        import torch

        if x.dtype == torch.bool and (isinstance(axis, int) or (axis is None and not keepdims)):
            return torch.any(x) if axis is None else torch.any(x, dim=axis, keepdim=keepdims)
        return self._base.any(x, axis=axis, keepdims=keepdims)

    def reshape(self, x, /, shape, *, copy=None):
        import torch

        return torch.reshape(x, shape) if copy is None else self._base.reshape(x, shape, copy=copy)


class _JaxDirect(_Direct):
    """JAX's namespace, with ``take`` and ``take_along_axis`` of non-negative indices in bounds
    (sdot never takes others): gathers that clamp instead of wrapping negative indices and
    filling beyond the bounds. In the traced solve each ``take`` was five equations
    (4 without the gather), 1,031 of them at 1e3 Diracs: a tenth of the program."""

    @staticmethod
    def take(x, indices, /, *, axis=None):
        from jax import lax

        axis = _take_axis(x, axis) % x.ndim
        if x.shape[axis] == 0 or indices.size == 0:          # (lax.gather's corner cases)
            import jax.numpy as jnp

            return jnp.take(x, indices, axis=axis, mode="clip")
        # jnp.take's gather, without its jit wrapper (one equation less each, 1,031 of them)
        dims = lax.GatherDimensionNumbers(
            offset_dims=tuple(range(axis)) + tuple(range(axis + indices.ndim, x.ndim + indices.ndim - 1)),
            collapsed_slice_dims=(axis,), start_index_map=(axis,))
        return lax.gather(x, lax.expand_dims(indices, (indices.ndim,)), dims,
                          x.shape[:axis] + (1,) + x.shape[axis + 1:], mode=lax.GatherScatterMode.CLIP)

    @staticmethod
    def take_along_axis(x, indices, /, *, axis=-1):
        import jax.numpy as jnp

        return jnp.take_along_axis(x, indices, axis=axis, mode="clip", wrap_negative_indices=False)
