"""The few primitives the array API standard lacks and the solver needs.

Every function takes the namespace ``xp`` and arrays of it, and has a pure
array-API fallback (exercised by the ``array_api_strict`` test backend).
Platform accelerations (scipy's cKDTree and sparse LU, ``np.bincount``,
``Tensor.index_add``, ``jax.ops.segment_sum``) are used when the arrays live
on the CPU and are concrete (not traced).

This is the only module of ``sdot._core`` that may import a framework.
"""
from __future__ import annotations

import os
import sys
import threading

import array_api_compat as aac
import numpy as np

__all__ = [
    "segment_sum", "while_loop", "fori_loop", "cond", "tree_where", "column", "to_int", "to_host", "host_call",
    "is_traced", "host_any", "host_share", "bucket", "capacity", "set_rows", "jit_on_jax", "knn", "nearest",
    "delaunay_neighbours", "regular_neighbours", "regular_rings", "solve_laplacian", "conjugate_gradient",
    "flat_take", "blockwise", "select",
    "true_entries", "put_rows",
]


# --------------------------------------------------------------------- helpers
def is_traced(*xs) -> bool:
    """True if one of ``xs`` is a JAX tracer (inside jit / vmap / grad)."""
    if "jax" not in sys.modules:
        return False
    import jax

    return any(isinstance(x, jax.core.Tracer) for x in xs)


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


def host_share(xp, mask) -> float:
    """Host share of the true entries of ``mask`` in eager mode; 0 when traced."""
    if is_traced(mask) or mask.shape[0] == 0:
        return 0.0
    return float(xp.sum(xp.astype(mask, xp.int64))) / mask.shape[0]


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


#: Rows per block of the eager kernels: their temporaries stay in the CPU caches.
BLOCK = 16384
#: Threads running the blocks of NumPy kernels (NumPy releases the GIL in its loops;
#: torch runs its own threads): ``SDOT_NUM_THREADS``, default the cores, at most 8.
THREADS = max(1, int(os.environ.get("SDOT_NUM_THREADS", min(os.cpu_count() or 1, 8))))
_pool = []
_in_block = threading.local()


def blockwise(xp, fn, *arrays):
    """``fn(*arrays)`` on blocks of :data:`BLOCK` rows (eager NumPy and torch),
    the results (an array or a tuple of arrays) concatenated.

    Row-independent kernels only. NumPy blocks run on :data:`THREADS` threads
    (a kernel called inside a block runs its blocks in that thread). JAX
    (traced or not) and array_api_strict run ``fn`` once: XLA fuses the
    temporaries away.
    """
    n = arrays[0].shape[0]
    if n <= BLOCK or not (aac.is_numpy_array(arrays[0]) or aac.is_torch_array(arrays[0])):
        return fn(*arrays)
    blocks = [tuple(a[s:s + BLOCK, ...] for a in arrays) for s in range(0, n, BLOCK)]
    if THREADS > 1 and aac.is_numpy_array(arrays[0]) and not getattr(_in_block, "busy", False):
        parts = list(_threads().map(lambda block: _run_block(fn, block), blocks))
    else:
        parts = [fn(*block) for block in blocks]
    if isinstance(parts[0], tuple):
        return tuple(xp.concat(p, axis=0) for p in zip(*parts))
    return xp.concat(parts, axis=0)


def _threads():
    if not _pool:
        from concurrent.futures import ThreadPoolExecutor

        _pool.append(ThreadPoolExecutor(THREADS, thread_name_prefix="sdot"))
    return _pool[0]


def _run_block(fn, block):
    _in_block.busy = True
    try:
        return fn(*block)
    finally:
        _in_block.busy = False


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


# ------------------------------------------------------------ control flow
def while_loop(cond, body, state):
    """``jax.lax.while_loop`` when the state is traced, a Python loop otherwise."""
    if is_traced(*_leaves(state)):
        import jax

        return jax.lax.while_loop(cond, body, state)
    held = [state]
    del state
    while bool(cond(held[0])):
        held.append(body(held.pop()))     # only ``body`` holds the old state: it may drop it early
    return held[0]


def fori_loop(lower: int, upper: int, body, state):
    """``state = body(i, state)`` for ``i`` in ``range(lower, upper)`` (``jax.lax.fori_loop``
    when the state is traced)."""
    if is_traced(*_leaves(state)):
        import jax

        return jax.lax.fori_loop(lower, upper, body, state)
    for i in range(lower, upper):
        state = body(i, state)
    return state


def cond(pred, true_fn, false_fn):
    """``true_fn()`` if ``pred`` else ``false_fn()`` (``jax.lax.cond`` when traced)."""
    if is_traced(pred):
        import jax

        return jax.lax.cond(pred, true_fn, false_fn)
    return true_fn() if bool(pred) else false_fn()


def host_call(fn, *args):
    """``fn(*args)`` on the host: directly, or ``jax.debug.callback`` when traced."""
    if is_traced(*args):
        import jax

        jax.debug.callback(fn, *args)
    else:
        fn(*args)


def tree_where(xp, pred, a, b):
    """``a`` where the scalar ``pred`` holds, else ``b``, leaf by leaf (tuples of arrays)."""
    if isinstance(a, tuple):
        return type(a)(*(tree_where(xp, pred, x, y) for x, y in zip(a, b))) if hasattr(a, "_fields") \
            else tuple(tree_where(xp, pred, x, y) for x, y in zip(a, b))
    return xp.where(pred, a, b)


def column(x, c):
    """Column ``c`` (an int, or a traced integer) of the 2-d array ``x``."""
    return x[:, c]


def to_int(x) -> int:
    """Host integer of a concrete 0-d array (eager sizing only)."""
    return int(x)


def to_host(x):
    """NumPy copy of a concrete array (eager sizing only)."""
    view = _host_view(x)
    if view is not None:
        return np.asarray(view)
    if aac.is_torch_array(x):
        return x.detach().cpu().numpy()
    return np.from_dlpack(x) if hasattr(x, "__dlpack__") else np.asarray(x)


def _leaves(state):
    if isinstance(state, (tuple, list)):
        return [leaf for item in state for leaf in _leaves(item)]
    if isinstance(state, dict):
        return [leaf for item in state.values() for leaf in _leaves(item)]
    return [state]


# ---------------------------------------------------------------- host calls
def _host_callback(xp, fn, result_shape, result_dtype, *args):
    """Run the NumPy function ``fn`` on concrete copies of ``args``.

    Eagerly on CPU arrays: directly (NumPy views, no copy). Under ``jax.jit`` on
    the CPU: ``jax.pure_callback`` (sequential under ``vmap``). Returns None
    where the host is not reachable without a device copy (GPU, array_api_strict):
    the caller then uses its pure array-API fallback.
    """
    if is_traced(*args):
        import jax

        if jax.default_backend() != "cpu":
            return None
        spec = jax.ShapeDtypeStruct(result_shape, result_dtype)
        return jax.pure_callback(lambda *a: np.asarray(fn(*map(np.asarray, a)), dtype=result_dtype),
                                 spec, *args, vmap_method="sequential")
    host = [_host_view(a) for a in args]
    if any(h is None for h in host):
        return None
    return _from_host(xp, np.asarray(fn(*host), dtype=result_dtype), args[0])


# ------------------------------------------------------------ nearest neighbours
def knn(xp, points, k: int):
    """Indices ``(n, k)`` of the k nearest ``points`` of each point (itself first).

    scipy's cKDTree on the host; a chunked brute force in pure array API otherwise
    (O(n^2) work).
    """
    def host(p):
        from scipy.spatial import cKDTree

        return np.asarray(cKDTree(p).query(p, k=k, workers=-1)[1], dtype=np.int64).reshape(len(p), k)
    out = _host_callback(xp, host, (points.shape[0], k), np.int64, points)
    return _knn_brute_force(xp, points, k, points) if out is None else out


def delaunay_neighbours(xp, points):
    """Neighbours of each point in the Delaunay triangulation, ``(n, W)`` (``W`` the
    largest degree), -1 padding; points without a triangle (duplicates, collinear
    inputs) get their nearest points instead.

    scipy's Qhull on the host, eagerly. None under ``jax.jit`` (Qhull crashed in
    XLA's callback threads) and without a host: the caller falls back to :func:`knn`.
    """
    host = None if is_traced(points) else _host_view(points)
    if host is None:
        return None
    table = _regular_table(host)
    lonely = np.flatnonzero(table[:, 0] < 0)
    if lonely.size and len(host) > 1:
        from scipy.spatial import cKDTree

        k = min(table.shape[1] + 1, len(host))
        near = np.asarray(cKDTree(host).query(host[lonely], k=k)[1]).reshape(lonely.size, k)
        table[lonely, :k - 1] = near[:, 1:]
    return _from_host(xp, table, points)


def regular_neighbours(xp, points, weights, active):
    """Neighbours of each active point in the regular (weighted Delaunay)
    triangulation of ``points`` with ``weights``, ``(n, W)``, -1 padding.

    The triangulation is the lower convex hull of the lifted points
    ``(y_i, |y_i - c|^2 - psi_i)``; point i's power cell is the intersection of
    the half-planes of its neighbours there, so they are exactly the seeds that
    can cut it. Rows of hidden (empty-celled) and inactive points are all -1.
    Eagerly on the host only (scipy's Qhull); None otherwise or if Qhull fails.
    """
    table = _on_host(_regular_table, points, weights, active)
    return None if table is None else _from_host(xp, table, points)


def regular_rings(xp, points, weights, active, stop_if_hidden=False):
    """Each active point's neighbours in the regular triangulation, counter-clockwise
    around it: ``(labels (n, W), count (n,), closed (n,))``, -1 padding.

    The dual triangles of point i, in angular order, give the vertices of its
    power cell; ``labels[i, k]`` is the neighbour across the edge from vertex k
    to vertex k + 1 (the :mod:`.polygons` convention). ``closed``: the ring goes
    all the way round; an open ring (a point on the hull) lists every
    neighbour, in no useful order. Hidden and inactive points have count 0.
    ``stop_if_hidden``: if an active point is hidden, only ``count`` is right.
    Eagerly on the host only (scipy's Qhull); None otherwise or if Qhull fails.
    """
    found = _on_host(lambda *a: _rings(*a, stop_if_hidden), points, weights, active)
    return None if found is None else tuple(_from_host(xp, a, points) for a in found)


def _on_host(fn, *args):
    """``fn`` on NumPy views of the concrete CPU arrays ``args`` (eagerly), else None."""
    if is_traced(*args):
        return None
    host = [_host_view(a) for a in args]
    return None if any(h is None for h in host) else fn(*host)


def _lower_triangles(p, psi, keep, strict=False):
    """Triangles (T, 3) of the regular triangulation of the points ``keep``: the lower
    facets of the hull of ``(y_i, |y_i - c|^2 - psi_i)`` (Delaunay if ``psi`` is None),
    in Morton order (Qhull is faster on spatially sorted points). ``strict``: without
    vertical facets. Raises QhullError or ValueError on degenerate inputs."""
    from scipy.spatial import ConvexHull, Delaunay

    keep = keep[_morton_order(p[keep])]
    if psi is None:
        return keep[Delaunay(p[keep]).simplices]
    q = p[keep] - p[keep].mean(axis=0)
    hull = ConvexHull(np.column_stack([q, np.sum(q * q, axis=1) - psi[keep]]), qhull_options="Qt")
    lower = hull.equations[:, 2] < 0 if strict else hull.equations[:, 2] <= 0
    return keep[hull.simplices[lower]]


def _morton_order(p):
    """Permutation sorting the points ``p`` (m, 2) along a Z-order curve."""
    span = np.ptp(p, axis=0)
    grid = ((p - p.min(axis=0)) / np.where(span > 0, span, 1.0) * 65535).astype(np.uint64)

    def spread(v):                                  # the 16 bits of v on the even bits
        for shift, mask in ((8, 0x00FF00FF), (4, 0x0F0F0F0F), (2, 0x33333333), (1, 0x55555555)):
            v = (v | (v << np.uint64(shift))) & np.uint64(mask)
        return v
    return np.argsort(spread(grid[:, 0]) | (spread(grid[:, 1]) << np.uint64(1)), kind="stable")


def _rings(p, psi, active, stop_if_hidden=False):
    """Host :func:`regular_rings`."""
    from scipy.spatial import QhullError

    n = len(p)
    try:
        tri = _lower_triangles(p, psi, np.flatnonzero(active), strict=True)
    except (QhullError, ValueError):
        return None
    if stop_if_hidden:
        count = np.bincount(tri.reshape(-1), minlength=n)
        if np.any(active & (count == 0)):
            return -np.ones((n, 1), np.int64), count, np.zeros((n,), bool)
    a, b, c = p[tri[:, 0]], p[tri[:, 1]], p[tri[:, 2]]
    cross = (b[:, 0] - a[:, 0]) * (c[:, 1] - a[:, 1]) - (b[:, 1] - a[:, 1]) * (c[:, 0] - a[:, 0])
    tri = np.where((cross < 0)[:, None], tri[:, [0, 2, 1]], tri)         # counter-clockwise
    seed = tri.reshape(-1)                  # each corner of each triangle: its point,
    prv = tri[:, [1, 2, 0]].reshape(-1)     # the neighbour of its incoming edge,
    nxt = tri[:, [2, 0, 1]].reshape(-1)     # that of its outgoing edge
    d = 0.5 * (p[prv] + p[nxt]) - p[seed]   # inside the triangle's angle at the point
    r = d[:, 1] / np.maximum(np.abs(d[:, 0]) + np.abs(d[:, 1]), np.finfo(d.dtype).tiny)
    turn = np.where(d[:, 0] >= 0, r + 1.0, 3.0 - r)      # in [0, 4), increasing counter-clockwise
    order = np.argsort(seed * 4.0 + turn)
    seed, prv, nxt = seed[order], prv[order], nxt[order]
    count = np.bincount(seed, minlength=n)
    pos = np.arange(seed.size) - np.repeat(np.cumsum(count) - count, count)
    width = max(int(count.max(initial=0)), 1)
    labels = -np.ones((n, width), np.int64)
    labels[seed, pos] = nxt
    incoming = -np.ones((n, width), np.int64)
    incoming[seed, pos] = prv
    k = np.arange(width)[None, :]
    after = np.take_along_axis(incoming, (k + 1) % np.maximum(count, 1)[:, None], axis=1)
    closed = np.all((k >= count[:, None]) | (after == labels), axis=1) & (count >= 3)
    # an open ring misses the neighbour of its first incoming edge: add every incoming
    # neighbour that is no outgoing one
    rows = np.flatnonzero(~closed & (count > 0))
    missing = (np.all(incoming[rows, :, None] != labels[rows, None, :], axis=2)
               & (k < count[rows, None]))
    extra = np.cumsum(missing, axis=1) - 1 + count[rows, None]          # their slots
    labels = np.pad(labels, ((0, 0), (0, max(int(extra.max(initial=0)) + 1 - width, 0))), constant_values=-1)
    labels[np.broadcast_to(rows[:, None], missing.shape)[missing], extra[missing]] = incoming[rows][missing]
    count[rows] += missing.sum(axis=1)
    return labels, count, closed


def _regular_table(p, psi=None, active=None):
    """Host neighbour table of the regular triangulation (Delaunay if ``psi`` is None)."""
    from scipy.spatial import QhullError

    n = len(p)
    keep = np.arange(n) if active is None else np.flatnonzero(active)
    try:
        tri = _lower_triangles(p, psi, keep)         # vertical facets: harmless here
    except (QhullError, ValueError):                # too few points, all collinear or coplanar
        if psi is not None:
            return None
        tri = np.zeros((0, 3), np.int64)
    a = tri.reshape(-1)
    b = np.roll(tri, 1, axis=1).reshape(-1)
    pairs = np.sort(np.concatenate([a * n + b, b * n + a]))
    pairs = pairs[np.concatenate([pairs[:1] >= 0, pairs[1:] != pairs[:-1]])]
    row, col = pairs // n, pairs % n
    degree = np.bincount(row, minlength=n)
    table = -np.ones((n, max(int(degree.max(initial=0)), 1)), dtype=np.int64)
    table[row, np.arange(row.size) - np.repeat(np.cumsum(degree) - degree, degree)] = col
    return table


def nearest(xp, points, queries):
    """Index ``(m,)`` of the nearest of ``points`` to each of ``queries``."""
    def host(p, q):
        from scipy.spatial import cKDTree

        return np.asarray(cKDTree(p).query(q, k=1, workers=-1)[1], dtype=np.int64).reshape(len(q))
    out = _host_callback(xp, host, (queries.shape[0],), np.int64, points, queries)
    return _knn_brute_force(xp, points, 1, queries)[:, 0] if out is None else out


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
def solve_laplacian(xp, rows, cols, weights, diag, rhs, rtol=None):
    """Solve ``(D - W) x = rhs`` for a sparse symmetric weighted Laplacian.

    ``W[rows, cols] += weights`` (entries may repeat), ``D = diag`` (already
    including the gauge regulariser), to a relative residual ``rtol`` (a 0-d
    array; default :data:`CG_RTOL`). On the host, in FP64: conjugate gradient
    preconditioned by the sparse LU factors of the last matrix of the same size
    (successive Newton matrices differ little), or, when that does not reach
    ``rtol`` in :data:`CG_MAX_ITER` iterations, a new factorisation (scipy's
    SuperLU in symmetric mode), kept for the next solve. Jacobi-preconditioned
    conjugate gradient in pure array API where the host is not reachable.
    """
    if rtol is None:
        rtol = xp.asarray(CG_RTOL, dtype=rhs.dtype, device=aac.device(rhs))

    def host(r, c, w, d, b, tol):
        import scipy.sparse as sp

        n = d.shape[0]
        ar = np.arange(n)
        mat = sp.csr_matrix(
            (np.concatenate([-w.astype(np.float64), d.astype(np.float64)]),
             (np.concatenate([r, ar]), np.concatenate([c, ar]))), shape=(n, n))
        return _factor_cache.solve(mat, b.astype(np.float64), float(tol))
    out = _host_callback(xp, host, tuple(rhs.shape), _numpy_dtype(rhs), rows, cols, weights, diag, rhs, rtol)
    return _solve_cg(xp, rows, cols, weights, diag, rhs, rtol) if out is None else out


#: Default relative residual of the conjugate gradients.
CG_RTOL = 1e-10
#: Iterations allowed before a new factorisation.
CG_MAX_ITER = 40
#: Iterations beyond which the factors are refreshed for the next solve.
CG_REFRESH = 20


class _FactorCache:
    """The last sparse LU factorisation of the process (one at a time, under a lock:
    not thread-local, XLA runs host callbacks on threads of its own);
    ``factorisations`` and ``reuses`` count what :meth:`solve` did."""

    def __init__(self):
        self.lu, self.factorisations, self.reuses = None, 0, 0
        self.lock = threading.Lock()

    def solve(self, mat, b, rtol):
        with self.lock:
            return self._solve(mat, b, rtol)

    def _solve(self, mat, b, rtol):
        from scipy.sparse.linalg import splu

        lu, self.lu = self.lu, None
        if lu is not None and lu.shape == mat.shape:
            x, iterations = _pcg(mat, b, lu.solve, rtol, CG_MAX_ITER)
            if x is not None:
                self.reuses += 1
                if iterations <= CG_REFRESH:    # else the factors have aged: new ones next time
                    self.lu = lu
                return x
        lu = splu(mat.tocsc(), permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0,
                  options=dict(SymmetricMode=True))
        self.lu = lu
        self.factorisations += 1
        return lu.solve(b)


_factor_cache = _FactorCache()


def _pcg(mat, b, precondition, rtol, max_iter):
    """Host conjugate gradient on the scipy matrix ``mat``: ``(x, iterations)``, x None
    unless the true residual ``|b - mat x|`` is within ``rtol |b|``."""
    import array_api_compat.numpy as npx

    x, it = conjugate_gradient(npx, mat.__matmul__, precondition, b, rtol, max_iter)
    return (x if np.linalg.norm(b - mat @ x) <= rtol * np.linalg.norm(b) else None), int(it)


def _numpy_dtype(x):
    return np.float32 if "float32" in str(x.dtype) else np.float64


def _solve_cg(xp, rows, cols, weights, diag, rhs, rtol, max_iter=None):
    n = rhs.shape[0]

    def matvec(x):
        return diag * x - segment_sum(xp, weights * xp.take(x, cols), rows, n)
    return conjugate_gradient(xp, matvec, lambda r: r / diag, rhs, rtol,
                              4 * n + 100 if max_iter is None else max_iter)[0]


def conjugate_gradient(xp, matvec, precondition, rhs, rtol, max_iter):
    """Preconditioned conjugate gradient from 0 until ``|r| <= rtol |rhs|`` (the
    recurrence's residual) or ``max_iter`` iterations: ``(x, iterations)``. Traceable."""
    x = xp.zeros_like(rhs)
    z = precondition(rhs)
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
        z = precondition(r)
        rz_new = xp.sum(r * z)
        p = z + (rz_new / rz) * p
        return x, r, p, rz_new, it + 1

    it0 = xp.asarray(0, device=aac.device(rhs))
    x, _, _, _, it = while_loop(cond, body, (x, rhs, z, xp.sum(rhs * z), it0))
    return x, it


def select(xp, mask, size: int):
    """``size`` indices, the true entries of the 1-d ``mask`` first (in order).

    Returns ``(indices, valid)``; when ``size`` exceeds the number of true
    entries, the extra indices are distinct false entries marked invalid.
    Traceable (a stable argsort), so shapes stay static.
    """
    order = xp.argsort(xp.astype(~mask, xp.int8), stable=True)[:size]
    return order, xp.take(mask, order)


def true_entries(xp, mask):
    """Eagerly, :func:`select` of the true entries of the 1-d ``mask``: as many
    indices as true entries (bucketed for JAX), at least one; ``(indices, valid)``."""
    n = mask.shape[0]
    return select(xp, mask, max(capacity(xp, xp.sum(xp.astype(mask, xp.int64)), mask, n), min(n, 1)))


def set_rows(xp, x, idx, values):
    """``x`` with rows ``idx`` (distinct) replaced by ``values``; out of place, traceable."""
    if aac.is_numpy_array(x):
        out = x.copy()
        out[idx] = values
        return out
    if aac.is_torch_array(x):
        return x.index_copy(0, idx, values)
    if aac.is_jax_array(x):
        return x.at[idx].set(values)
    if idx.shape[0] == 0:
        return x
    order = xp.argsort(idx)
    sorted_idx = xp.take(idx, order)
    rows = xp.arange(x.shape[0], dtype=idx.dtype, device=aac.device(idx))
    pos = xp.clip(xp.searchsorted(sorted_idx, rows), 0, idx.shape[0] - 1)
    hit = xp.take(sorted_idx, pos) == rows
    picked = xp.take(values, xp.take(order, pos), axis=0)
    return xp.where(xp.reshape(hit, (-1,) + (1,) * (x.ndim - 1)), picked, x)


def put_rows(xp, x, idx, values):
    """``x`` with rows ``idx`` (distinct) replaced by ``values``, in place if possible.

    Only for arrays that sdot created itself (never the caller's): NumPy and
    torch write in place; other frameworks get a copy (:func:`set_rows`).
    """
    if aac.is_numpy_array(x) or aac.is_torch_array(x):
        x[idx, ...] = values
        return x
    return set_rows(xp, x, idx, values)


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
