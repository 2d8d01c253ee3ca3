"""The array-API namespace the solver computes with.

array_api_compat's, except on torch, where the three functions the kernels call most
(``take``, ``take_along_axis``, ``where``: about 20% of the ops of a solve) call torch
directly. array_api_compat's versions add a pass over the indices for negative ones, which
sdot never takes at (a negative index raises in torch), and a dtype promotion that the
kernels' operands, of one dtype, do not need. Measured: box 1e3 on torch 0.22 -> 0.18 s.
"""
from __future__ import annotations

import array_api_compat as aac


def namespace(*arrays):
    """The namespace of ``arrays`` (as :func:`array_api_compat.array_namespace`)."""
    if _torch_direct and all(map(aac.is_torch_array, arrays)):
        return _torch_direct[0]
    xp = aac.array_namespace(*arrays)
    if not any(map(aac.is_torch_array, arrays)):
        return xp
    if not _torch_direct:
        _torch_direct.append(_TorchDirect(xp))
    return _torch_direct[0]


_torch_direct = []


class _TorchDirect:
    """array_api_compat's torch namespace, with direct ``take``, ``take_along_axis``
    and ``where`` (non-negative indices; ``where`` of tensors of one dtype, or of a
    tensor and a Python scalar)."""

    def __init__(self, base):
        # base's names as plain attributes: a __getattr__ per lookup would cost the gain
        self.__dict__.update({name: getattr(base, name) for name in dir(base)
                              if not name.startswith("__") and name not in type(self).__dict__})
        self._base, self.__name__ = base, base.__name__

    @staticmethod
    def take(x, indices, /, *, axis=None):
        import torch

        if axis is None:
            if x.ndim != 1:
                raise ValueError("axis must be specified when ndim > 1")
            axis = 0
        return torch.index_select(x, axis, indices)

    @staticmethod
    def take_along_axis(x, indices, /, *, axis=-1):
        import torch

        return torch.take_along_dim(x, indices, dim=axis)

    def where(self, condition, x1, x2, /):
        import torch

        if isinstance(x1, torch.Tensor) and isinstance(x2, torch.Tensor) and x1.dtype != x2.dtype:
            return self._base.where(condition, x1, x2)      # array-API promotion
        return torch.where(condition, x1, x2)
