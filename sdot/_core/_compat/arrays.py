"""Array primitives the standard lacks: scatter-add, row gathers and writes, sizes."""
from __future__ import annotations

import array_api_compat as aac
import numpy as np

from .host import static_shapes, to_int
from .namespaces import namespace


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
    size = bucket(to_int(total), like)
    return size if limit is None else min(size, limit)


def flat_take(x, idx):
    """Gather rows ``x[idx]`` along axis 0 with an integer index array of any shape."""
    xp = namespace(x)
    flat = xp.reshape(idx, (-1,))
    out = xp.take(x, flat, axis=0)
    return xp.reshape(out, tuple(idx.shape) + tuple(x.shape[1:]))


def remainder(a, b):
    """``a % b`` of non-negative integer arrays (broadcast). On JAX the bare remainder (one
    equation, where ``%`` adds ten for the signs: 1,250 equations of the traced solve at 1e3
    Diracs were the ``%`` of :func:`..planar.polygons.clip_polygons`)."""
    if aac.is_jax_array(a) or aac.is_jax_array(b):
        import jax

        dtype = jax.numpy.result_type(a, b)
        a, b = jax.numpy.broadcast_arrays(jax.numpy.astype(a, dtype), jax.numpy.astype(b, dtype))
        return jax.lax.rem(a, b)
    return a % b


def row_gather(x, idx):
    """``x[r, idx[r, ...]]`` row by row (``x`` of shape (n, V) or (n, V, d)).

    One take from ``x`` flattened over its first two axes, at ``r V + idx``: NumPy and
    torch take whole rows of (n V, 2) at once, where a per-axis ``take_along_axis``
    gathers each coordinate from a strided view (measured at 1e4 cells of 16 slots:
    0.28 against 4.2 ms on NumPy, 0.66 against 6.1 ms on torch; (n, V): 0.23 against
    0.55 ms).
    """
    xp = namespace(x)
    if aac.is_jax_array(x):
        flat = xp.reshape(idx, (idx.shape[0], -1))
        out = xp.stack([xp.take_along_axis(x[..., c], flat, axis=1) for c in range(x.shape[2])], axis=-1) \
            if x.ndim == 3 else xp.take_along_axis(x, flat, axis=1)
        return xp.reshape(out, tuple(idx.shape) + tuple(x.shape[2:]))
    n, cap = x.shape[0], x.shape[1]
    start = xp.arange(n, dtype=idx.dtype, device=aac.device(idx)) * cap
    flat = xp.reshape(idx, (n, -1)) + start[:, None]
    out = xp.take(xp.reshape(x, (n * cap,) + tuple(x.shape[2:])), xp.reshape(flat, (-1,)), axis=0)
    return xp.reshape(out, tuple(idx.shape) + tuple(x.shape[2:]))


def dot(a, b):
    """``sum(a * b, axis=-1)`` for a short last axis (coordinates), as a sum of its
    slices: NumPy reduces an axis of length 2 about ten times slower than it adds
    two slices. On JAX one product and one reduction (in a traced program, 2 equations instead
    of 11 in 2D; XLA fuses them)."""
    if aac.is_jax_array(a) or aac.is_jax_array(b):
        return namespace(a, b).sum(a * b, axis=-1)
    out = a[..., 0] * b[..., 0]
    for i in range(1, a.shape[-1]):
        out = out + a[..., i] * b[..., i]
    return out


#: Columns up to which :func:`row_max` and the like fold the columns on NumPy.
FOLD_COLUMNS = 16


def row_sum(xp, x):
    """``sum(x, axis=1)`` of an ``(n, V)`` array, as :func:`row_max` (0.09 against 0.24 ms
    for 1e4 rows of 8 columns). Column by column, so that a row's sum does not depend on
    the other rows (a product with a ones vector, 0.03 ms, rounds differently in blocks)."""
    return _fold(xp, x, xp.add, xp.sum)


def row_max(xp, x):
    """``max(x, axis=1)`` of an ``(n, V)`` array; on NumPy with few columns, a fold of
    ``maximum`` over the columns (NumPy reduces a short axis row by row: measured at 1e4
    rows, 0.09 against 0.43 ms for 8 columns, 0.23 against 0.44 ms for 16)."""
    return _fold(xp, x, xp.maximum, xp.max)


def row_min(xp, x):
    """``min(x, axis=1)``, as :func:`row_max`."""
    return _fold(xp, x, xp.minimum, xp.min)


def row_any(xp, x):
    """``any(x, axis=1)`` of a boolean ``(n, V)`` array, as :func:`row_max`."""
    return _fold(xp, x, xp.logical_or, xp.any)


def row_all(xp, x):
    """``all(x, axis=1)`` of a boolean ``(n, V)`` array, as :func:`row_max`."""
    return _fold(xp, x, xp.logical_and, xp.all)


def _fold(xp, x, pairwise, reduce):
    if not aac.is_numpy_array(x) or not 0 < x.shape[1] <= FOLD_COLUMNS:
        return reduce(x, axis=1)
    out = x[:, 0]
    for c in range(1, x.shape[1]):
        out = pairwise(out, x[:, c])
    return out


def hits(xp, idx, n: int):
    """Boolean mask (n,) of the entries of the 1-d ``idx`` (negative entries ignored,
    duplicates allowed): a scatter of True (a scatter-add in pure array API)."""
    slot = xp.where(idx >= 0, idx, n)
    if aac.is_numpy_array(idx) or aac.is_torch_array(idx):
        out = xp.zeros((n + 1,), dtype=xp.bool, device=aac.device(idx))
        out[slot] = True
        return out[:n]
    if aac.is_jax_array(idx):
        return xp.zeros((n + 1,), dtype=xp.bool, device=aac.device(idx)).at[slot].set(True, wrap_negative_indices=False)[:n]
    ones = xp.ones(idx.shape, dtype=xp.int64, device=aac.device(idx))
    return segment_sum(xp, ones, slot, n + 1)[:n] > 0


def smallest(xp, x, k: int):
    """Column indices ``(m, k)`` of the ``k`` smallest entries of each row of ``x`` (m, n), in
    increasing order (ties in any order but the argsort's). A selection, not a sort: one pass
    for ``k = 1``, ``torch.topk`` and ``jax.lax.top_k`` otherwise (a brute-force k nearest at
    1e4 points: the argsort took 7 of a torch solve's 9 s)."""
    if k == 1:
        return xp.argmin(x, axis=1)[:, None]
    if aac.is_torch_array(x):
        import torch

        return torch.topk(x, k, dim=1, largest=False, sorted=True).indices
    if aac.is_jax_array(x):
        import jax

        return jax.lax.top_k(-x, k)[1]
    return xp.argsort(x, axis=1, stable=True)[:, :k]


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


def column(x, c):
    """Column ``c`` (an int, or a traced integer) of the 2-d array ``x``."""
    return x[:, c]


def select(xp, mask, size: int):
    """``size`` indices, the true entries of the 1-d ``mask`` first (in order).

    Returns ``(indices, valid)``; when ``size`` exceeds the number of true
    entries, the extra indices are distinct false entries marked invalid.
    Traceable, so shapes stay static: on JAX (whose sort on the CPU is slow: 25 ms
    for 1e5 entries, 1 s for 3.2e6) the position of each entry from prefix sums, and
    one scatter; eagerly on NumPy and torch the indices of the true entries, then of
    the first false ones (measured on NumPy, 1.6e5 entries: 0.07 ms, against 2.0 ms
    for the stable argsort of the mask that array_api_strict runs).
    """
    if aac.is_numpy_array(mask) or aac.is_torch_array(mask):
        order = xp.nonzero(mask)[0][:size]
        if order.shape[0] < size:
            order = xp.concat([order, xp.nonzero(~mask)[0][:size - order.shape[0]]])
        return order, xp.take(mask, order)
    if not aac.is_jax_array(mask):
        order = xp.argsort(xp.astype(~mask, xp.int8), stable=True)[:size]
        return order, xp.take(mask, order)
    n = mask.shape[0]
    ones = xp.astype(mask, xp.int64)
    before = xp.cumulative_sum(ones) - ones                 # true entries before each
    entry = xp.arange(n, dtype=xp.int64, device=aac.device(mask))
    position = xp.where(mask, before, xp.sum(ones) + entry - before)   # false ones after the true
    order = set_rows(xp, xp.zeros((size + 1,), dtype=xp.int64, device=aac.device(mask)),
                     xp.minimum(position, size), entry)      # slot ``size``: the entries left out
    order = order[:size]
    return order, xp.take(mask, order)


def first_columns(xp, keep, values, width: int, fill):
    """Per row of ``values`` (n, V), its entries where ``keep`` first, in order, then
    ``fill``: ``width`` columns. A stable argsort per row, or on JAX (slow sorts on the
    CPU) each kept entry's column from prefix sums along the row, and one scatter."""
    n, cap = values.shape
    dev = aac.device(values)
    if not aac.is_jax_array(values):
        order = xp.argsort(xp.astype(~keep, xp.int8), axis=1, stable=True)[:, :min(width, cap)]
        out = xp.take_along_axis(xp.where(keep, values, fill), order, axis=1)
        if cap >= width:
            return out
        tail = xp.full((n, width - cap), fill, dtype=values.dtype, device=dev)
        return xp.concat([out, tail], axis=1)
    column = xp.cumulative_sum(xp.astype(keep, xp.int64), axis=1) - 1
    row = xp.arange(n, dtype=xp.int64, device=dev)[:, None]
    slot = xp.where(keep & (column < width), row * width + column, n * width)     # n * width: dropped
    out = xp.full((n * width + 1,), fill, dtype=values.dtype, device=dev)
    out = set_rows(xp, out, xp.reshape(slot, (-1,)), xp.reshape(values, (-1,)))
    return xp.reshape(out[:n * width], (n, width))


def true_entries(xp, mask):
    """Eagerly, :func:`select` of the true entries of the 1-d ``mask``: as many
    indices as true entries (bucketed for JAX), at least one; ``(indices, valid)``."""
    n = mask.shape[0]
    return select(xp, mask, max(capacity(xp, xp.sum(xp.astype(mask, xp.int64)), mask, n), min(n, 1)))


def rows_where(xp, mask, budget: int | None = None):
    """The rows where the 1-d ``mask`` is true, as ``(rows, valid)``, in one code path for
    eager and traced runs: eagerly :func:`true_entries` (exactly those, at least one);
    under static shapes ``budget`` rows, the true ones first (:func:`select`), or with no
    budget every row, ``valid = mask``."""
    n = mask.shape[0]
    if not static_shapes(mask):
        return true_entries(xp, mask)
    if budget is None or budget >= n:
        return xp.arange(n, dtype=xp.int64, device=aac.device(mask)), mask
    return select(xp, mask, budget)


def set_rows(xp, x, idx, values):
    """``x`` with rows ``idx`` (distinct) replaced by ``values``; out of place, traceable."""
    if aac.is_numpy_array(x):
        out = x.copy()
        out[idx] = values
        return out
    if aac.is_torch_array(x):
        return x.index_copy(0, idx, values)
    if aac.is_jax_array(x):
        return x.at[idx].set(values, wrap_negative_indices=False)     # (a negative row: dropped)
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
