"""Where the host (NumPy, scipy) can be reached: tracing, views, callbacks.

Eagerly, NumPy arrays, CPU torch tensors and concrete CPU JAX arrays have NumPy
views (no copy); under ``jax.jit`` on the CPU a host function runs through
``jax.pure_callback``. Elsewhere (GPU, array_api_strict) the host is not used. The
host functions themselves (NumPy in, NumPy out) are in :mod:`sdot._host`.
"""
from __future__ import annotations

import sys

import array_api_compat as aac
import numpy as np

from ..._host import threads as host_threads
from ..._host.threads import HOST_THREAD


def is_traced(*xs) -> bool:
    """True if one of ``xs`` is a JAX tracer (inside jit / vmap / grad): loops and
    conditionals go through ``jax.lax``, host work through callbacks."""
    if "jax" not in sys.modules:
        return False
    import jax

    return any(isinstance(x, jax.core.Tracer) for x in xs)


def static_shapes(*xs) -> bool:
    """True if no shape may depend on the values of ``xs``: JAX tracers, and array_api_strict
    arrays while its ``data_dependent_shapes`` flag is off (the tests' stand-in for
    tracing). The core then takes fixed budgets with validity flags, and no host decision."""
    return is_traced(*xs) or _strict_without_data_dependent_shapes(xs)


def _strict_without_data_dependent_shapes(xs) -> bool:
    if "array_api_strict" not in sys.modules:
        return False
    import array_api_strict

    return (any(type(x).__module__.startswith("array_api_strict") for x in xs)
            and not array_api_strict.get_array_api_strict_flags()["data_dependent_shapes"])


def host_view(x):
    """A NumPy view of a concrete CPU array, or None (traced, GPU, strict, or a torch or JAX
    array while ``HostSettings.reachable`` is off)."""
    if aac.is_numpy_array(x):
        return x
    if not host_threads.settings().reachable:
        return None
    if aac.is_torch_array(x):          # (NumPy has no bfloat16)
        on_host = x.device.type == "cpu" and not _functorch_wrapped(x) and str(x.dtype) != "torch.bfloat16"
        return x.detach().numpy() if on_host else None
    if aac.is_jax_array(x) and not is_traced(x):
        if all(d.platform == "cpu" for d in x.devices()):
            return np.asarray(x)
    return None


def _functorch_wrapped(x) -> bool:
    """True for a tensor wrapped by a ``torch.func`` transform (no storage to view)."""
    import torch

    return torch._C._functorch.is_functorch_wrapped_tensor(x)


def from_host(xp, arr, like):
    """Bring a NumPy result back into ``xp`` on the device of ``like``."""
    if aac.is_torch_array(like):
        import torch

        return torch.from_numpy(np.ascontiguousarray(arr)).to(like.device)
    return xp.asarray(arr, device=aac.device(like))


def host_any(xp, mask) -> bool:
    """Host decision ``any(mask)`` in eager mode; False under static shapes.

    Used for the eager retries (capacity overflow, incomplete cells): under
    tracing no retry happens and the flags are reported instead.
    """
    if static_shapes(mask):
        return False
    return bool(xp.any(mask))


def known_none(xp, mask) -> bool:
    """True only if ``mask`` is known to hold no true entry: eagerly ``not any(mask)``,
    False under static shapes (where work skipped on ``not host_any`` would be lost)."""
    return not static_shapes(mask) and not bool(xp.any(mask))


def host_share(xp, mask) -> float:
    """Host share of the true entries of ``mask`` in eager mode; 0 under static shapes."""
    if static_shapes(mask) or mask.shape[0] == 0:
        return 0.0
    return float(xp.sum(xp.astype(mask, xp.int64))) / mask.shape[0]


def to_int(x) -> int:
    """Host integer of a concrete 0-d array (eager sizing only: an error under static shapes)."""
    if static_shapes(x):
        raise RuntimeError("sdot internal error: a size read from array values under static shapes")
    return int(x)


def host_call(fn, *args):
    """``fn(*args)`` on the host: directly, or ``jax.debug.callback`` when traced."""
    if is_traced(*args):
        import jax

        jax.debug.callback(fn, *args)
    else:
        fn(*args)


def host_callback(xp, fn, result_shape, result_dtype, *args):
    """Run the NumPy function ``fn`` on concrete copies of ``args``.

    Eagerly on CPU arrays: directly (NumPy views, no copy). Under ``jax.jit`` on the
    CPU: ``jax.pure_callback`` (sequential under ``vmap``), ``fn`` running on
    :data:`sdot._host.threads.HOST_THREAD`. Returns None where the host is not reachable
    without a device copy (GPU, array_api_strict): the caller then uses its pure
    array-API fallback.
    """
    if is_traced(*args):
        import jax

        if jax.default_backend() != "cpu" or not host_threads.settings().reachable:
            return None
        result_dtype = _without_x64(result_dtype)
        spec = jax.ShapeDtypeStruct(result_shape, result_dtype)

        def on_host_thread(*a):
            work = HOST_THREAD.submit(lambda: np.asarray(fn(*map(np.asarray, a)), dtype=result_dtype))
            return work.result()
        return jax.pure_callback(on_host_thread, spec, *args, vmap_method="sequential")
    host = [host_view(a) for a in args]
    if any(h is None for h in host):
        return None
    return from_host(xp, np.asarray(fn(*host), dtype=result_dtype), args[0])


def host_dtype(x):
    """The NumPy float dtype of the host's copy of ``x`` (a float array of any namespace)."""
    return np.float32 if "float32" in str(x.dtype) else np.float64


def _without_x64(dtype):
    """``dtype``, or its 32-bit kind when JAX runs without ``jax_enable_x64`` (its default):
    callbacks may not return 64-bit arrays then (indices become int32, as JAX's own are)."""
    import jax

    dtype = np.dtype(dtype)
    if jax.config.jax_enable_x64 or dtype.itemsize <= 4:
        return dtype
    return {"i": np.dtype(np.int32), "u": np.dtype(np.uint32), "f": np.dtype(np.float32)}.get(dtype.kind, dtype)


def compiled_call(xp, kernel, *args):
    """``kernel(*views)`` (a tuple of NumPy arrays, or None) on NumPy views of the concrete CPU
    arrays ``args``, brought back into ``xp`` like ``args[0]``, where the compiled host kernels
    run (:mod:`sdot._host.compiled`: eagerly, with numba, ``HostSettings.compiled`` on); else None
    (the caller runs its array kernels). The kernels compute in FP64; their floating-point
    results come back in the dtype of ``args[0]`` (FP32 inputs get FP32 results, computed more
    exactly)."""
    if static_shapes(*args):
        return None
    host = [host_view(a) for a in args]
    if any(h is None for h in host):
        return None
    from ..._host import compiled

    if not compiled.enabled():
        return None
    out = kernel(*host)
    if out is None:
        return None
    dtype = host[0].dtype
    same = lambda a: a.astype(dtype) if a.dtype.kind == "f" and dtype.kind == "f" and a.dtype != dtype else a  # noqa: E731
    return tuple(from_host(xp, same(a), args[0]) for a in out)


def on_host(fn, *args):
    """``fn`` on NumPy views of the concrete CPU arrays ``args`` (eagerly), else None."""
    if is_traced(*args):
        return None
    host = [host_view(a) for a in args]
    return None if any(h is None for h in host) else fn(*host)
