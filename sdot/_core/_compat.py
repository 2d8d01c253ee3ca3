"""The few primitives the array API standard lacks and the solver needs.

Every function takes the namespace ``xp`` and arrays of it, and has a pure
array-API fallback (exercised by the ``array_api_strict`` test backend).
Platform accelerations (scipy's cKDTree and sparse LU, ``np.bincount``,
``Tensor.index_add``, ``jax.ops.segment_sum``) are used when the arrays live
on the CPU and are concrete (not traced).

This is the only module of ``sdot._core`` that may import a framework.
"""
from __future__ import annotations

import sys

import array_api_compat as aac
import numpy as np

__all__ = [
    "segment_sum", "while_loop", "is_traced", "host_any", "bucket", "capacity", "set_rows",
    "jit_on_jax", "knn", "knn_index", "solve_laplacian", "flat_take", "select",
]


# --------------------------------------------------------------------- helpers
def is_traced(x) -> bool:
    """True if ``x`` is a JAX tracer (inside jit / vmap / grad)."""
    if "jax" not in sys.modules:
        return False
    import jax

    return isinstance(x, jax.core.Tracer)


def _host_view(x):
    """A NumPy view of a concrete CPU array, or None (traced, GPU, strict...)."""
    if aac.is_numpy_array(x):
        return x
    if aac.is_torch_array(x):
        return x.detach().numpy() if x.device.type == "cpu" else None
    if aac.is_jax_array(x) and not is_traced(x):
        if all(d.platform == "cpu" for d in x.devices()):
            return np.asarray(x)
    return None


def _from_host(xp, arr, like):
    """Bring a NumPy result back into ``xp`` on the device of ``like``."""
    if aac.is_torch_array(like):
        import torch

        return torch.from_numpy(np.ascontiguousarray(arr)).to(like.device)
    return xp.asarray(arr, device=aac.device(like))


def host_any(xp, mask) -> bool:
    """Host decision ``any(mask)`` in eager mode; False when traced.

    Used for the eager retries (capacity overflow, incomplete cells): under
    tracing no retry happens and the flags are reported instead.
    """
    if is_traced(mask):
        return False
    return bool(xp.any(mask))


def bucket(size: int, like) -> int:
    """Array size to allocate for ``size`` items.

    JAX compiles every primitive for every new shape, even eagerly: sizes are
    rounded up to a power of four so that the compiled kernels are reused.
    Other frameworks get the exact size.
    """
    if not aac.is_jax_array(like):
        return size
    bits = max(size - 1, 0).bit_length()
    return max(64, 1 << (bits + bits % 2))


def capacity(xp, total, like, limit=None) -> int:
    """Concrete size for ``total`` items (eager only), bucketed for JAX, at most ``limit``."""
    size = bucket(int(total), like)
    return size if limit is None else min(size, limit)


def flat_take(x, idx):
    """Gather rows ``x[idx]`` along axis 0 with an integer index array of any shape."""
    xp = aac.array_namespace(x)
    flat = xp.reshape(idx, (-1,))
    out = xp.take(x, flat, axis=0)
    return xp.reshape(out, tuple(idx.shape) + tuple(x.shape[1:]))


# ------------------------------------------------------------------ scatter-add
def segment_sum(xp, values, ids, n: int):
    """``out[k] = sum of values[ids == k]`` along axis 0 (duplicates accumulate)."""
    if aac.is_torch_array(values):
        out = values.new_zeros((n,) + tuple(values.shape[1:]))
        return out.index_add(0, ids, values)
    if aac.is_jax_array(values):
        import jax

        return jax.ops.segment_sum(values, ids, num_segments=n)
    if aac.is_numpy_array(values):
        if values.ndim == 1:
            return np.bincount(ids, weights=values, minlength=n).astype(values.dtype, copy=False)
        out = np.zeros((n,) + values.shape[1:], dtype=values.dtype)
        np.add.at(out, ids, values)
        return out
    return _segment_sum_sorted(xp, values, ids, n)


def _segment_sum_sorted(xp, values, ids, n):
    """Pure array-API segment sum: sort, prefix sums, differences at boundaries."""
    order = xp.argsort(ids, stable=True)
    ids_sorted = xp.take(ids, order)
    v = xp.take(values, order, axis=0)
    zero = xp.zeros((1,) + tuple(v.shape[1:]), dtype=v.dtype, device=aac.device(v))
    csum = xp.concat([zero, xp.cumulative_sum(v, axis=0)], axis=0)
    bounds = xp.searchsorted(ids_sorted, xp.arange(n + 1, dtype=ids.dtype, device=aac.device(ids)))
    return xp.take(csum, bounds[1:], axis=0) - xp.take(csum, bounds[:-1], axis=0)


# ------------------------------------------------------------------ while loop
def while_loop(cond, body, state):
    """``jax.lax.while_loop`` when the state is traced, a Python loop otherwise."""
    leaves = state if isinstance(state, tuple) else (state,)
    if any(is_traced(x) for x in leaves):
        import jax

        return jax.lax.while_loop(cond, body, state)
    while bool(cond(state)):
        state = body(state)
    return state


# ------------------------------------------------------------ nearest neighbours
def knn(xp, points, k: int, queries=None):
    """Indices ``(m, k)`` of the k nearest ``points`` of each query point.

    ``queries`` defaults to ``points`` (then each point is its own first neighbour).
    Columns are sorted by increasing distance. See :func:`knn_index`.
    """
    return knn_index(xp, points)(points if queries is None else queries, k)


def knn_index(xp, points):
    """A search structure over ``points``: ``query(queries, k) -> (m, k)`` indices.

    scipy's cKDTree (built once) on concrete CPU arrays; a chunked brute force
    in pure array API otherwise (O(n m) work).
    """
    host = _host_view(points)
    if host is None:
        return lambda queries, k: _knn_brute_force(xp, points, k, queries)
    from scipy.spatial import cKDTree

    tree = cKDTree(host)

    def query(queries, k):
        host_q = _host_view(queries)
        if host_q is None:
            return _knn_brute_force(xp, points, k, queries)
        _, idx = tree.query(host_q, k=k, workers=-1)
        return _from_host(xp, np.asarray(idx, dtype=np.int64).reshape(queries.shape[0], k), points)
    return query


def _knn_brute_force(xp, points, k, queries):
    n, dim = points.shape
    chunk = max(1, int(4e6 // max(n * dim, 1)))
    rows = []
    for start in range(0, queries.shape[0], chunk):
        block = queries[start:min(start + chunk, queries.shape[0]), :]
        diff = block[:, None, :] - points[None, :, :]
        d2 = xp.sum(diff * diff, axis=-1)
        rows.append(xp.argsort(d2, axis=1, stable=True)[:, :k])
    return xp.astype(xp.concat(rows, axis=0), xp.int64)


# --------------------------------------------------------------- linear solve
def solve_laplacian(xp, rows, cols, weights, diag, rhs):
    """Solve ``(D - W) x = rhs`` for a sparse symmetric weighted Laplacian.

    ``W[rows, cols] += weights`` (entries may repeat), ``D = diag`` (already
    including the gauge regulariser). Direct sparse LU (scipy, COLAMD) on
    concrete CPU arrays, in FP64; Jacobi-preconditioned conjugate gradient in
    pure array API otherwise.
    """
    host = [_host_view(a) for a in (rows, cols, weights, diag, rhs)]
    if all(h is not None for h in host):
        import scipy.sparse as sp
        from scipy.sparse.linalg import spsolve

        r, c, w, d, b = host
        n = d.shape[0]
        ar = np.arange(n)
        mat = sp.csc_matrix(
            (np.concatenate([-w.astype(np.float64), d.astype(np.float64)]),
             (np.concatenate([r, ar]), np.concatenate([c, ar]))), shape=(n, n))
        x = spsolve(mat, b.astype(np.float64), permc_spec="COLAMD")
        return _from_host(xp, np.asarray(x, dtype=b.dtype), rhs)
    return _solve_cg(xp, rows, cols, weights, diag, rhs)


def _solve_cg(xp, rows, cols, weights, diag, rhs, rtol=1e-13, max_iter=None):
    n = rhs.shape[0]
    max_iter = 4 * n + 100 if max_iter is None else max_iter

    def matvec(x):
        return diag * x - segment_sum(xp, weights * xp.take(x, cols), rows, n)

    x = xp.zeros_like(rhs)
    r = rhs
    z = r / diag
    p = z
    rz = xp.sum(r * z)
    target = rtol * xp.sqrt(xp.sum(rhs * rhs))

    def cond(s):
        x, r, p, rz, it = s
        return xp.logical_and(xp.sqrt(xp.sum(r * r)) > target, it < max_iter)

    def body(s):
        x, r, p, rz, it = s
        ap = matvec(p)
        alpha = rz / xp.sum(p * ap)
        x = x + alpha * p
        r = r - alpha * ap
        z = r / diag
        rz_new = xp.sum(r * z)
        p = z + (rz_new / rz) * p
        return x, r, p, rz_new, it + 1

    it0 = xp.asarray(0, device=aac.device(rhs))
    return while_loop(cond, body, (x, r, p, rz, it0))[0]


def select(xp, mask, size: int):
    """``size`` indices, the true entries of the 1-d ``mask`` first (in order).

    Returns ``(indices, valid)``; when ``size`` exceeds the number of true
    entries, the extra indices are distinct false entries marked invalid.
    Traceable (a stable argsort), so shapes stay static.
    """
    order = xp.argsort(xp.astype(~mask, xp.int8), stable=True)[:size]
    return order, xp.take(mask, order)


def set_rows(xp, x, idx, values):
    """``x`` with rows ``idx`` (distinct) replaced by ``values``; out of place, traceable."""
    order = xp.argsort(idx)
    sorted_idx = xp.take(idx, order)
    rows = xp.arange(x.shape[0], dtype=idx.dtype, device=aac.device(idx))
    pos = xp.clip(xp.searchsorted(sorted_idx, rows), 0, idx.shape[0] - 1)
    hit = xp.take(sorted_idx, pos) == rows
    picked = xp.take(values, xp.take(order, pos), axis=0)
    return xp.where(xp.reshape(hit, (-1,) + (1,) * (x.ndim - 1)), picked, x)


def jit_on_jax(*static_argnames):
    """Decorator: run the function under ``jax.jit`` when called with JAX arrays.

    JAX dispatches eager operations one by one and compiles each for each new
    shape; a jitted kernel compiles once per shape. ``xp`` (the first argument)
    and ``static_argnames`` are static. Other frameworks call the function as is.
    """
    def wrap(fn):
        jitted = []

        def call(xp, *args, **kwargs):
            if "jax" in getattr(xp, "__name__", ""):
                if not jitted:
                    import inspect

                    import jax

                    names = list(inspect.signature(fn).parameters)
                    nums = (0,) + tuple(names.index(a) for a in static_argnames)
                    jitted.append(jax.jit(fn, static_argnums=nums, static_argnames=static_argnames))
                return jitted[0](xp, *args, **kwargs)
            return fn(xp, *args, **kwargs)

        call.__doc__, call.__name__, call.__wrapped__ = fn.__doc__, fn.__name__, fn
        return call
    return wrap
