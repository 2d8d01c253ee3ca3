"""Rows in blocks on the host's threads, and host work in the background (eager NumPy and
torch; JAX and array_api_strict run the function once, XLA fusing the temporaries).

The blocks follow the process's settings (``settings()`` below: :func:`sdot._host.threads.settings`).
"""
from __future__ import annotations

import array_api_compat as aac

from .._host import threads as host_threads


def blockwise(xp, fn, *arrays):
    """``fn(*arrays)`` on blocks of at most ``settings().block`` rows (eager NumPy and
    torch), the results (an array or a tuple of arrays) concatenated.

    Row-independent kernels only. NumPy blocks run on ``settings().threads`` threads
    (a kernel called inside a block runs its blocks in that thread), in equal blocks
    of a multiple of the threads when rows allow (1e4 rows on 2 threads: 2 blocks of
    5000; measured box 1e4 about 8% faster than one block on one thread). JAX
    (traced or not) and array_api_strict run ``fn`` once: XLA fuses the
    temporaries away.
    """
    n = arrays[0].shape[0]
    threads = host_threads.settings().threads
    threaded = threads > 1 and aac.is_numpy_array(arrays[0]) and not host_threads.in_block()
    size = host_threads.block_rows(n, threads if threaded else 1)
    if n <= size or not (aac.is_numpy_array(arrays[0]) or aac.is_torch_array(arrays[0])):
        return fn(*arrays)
    blocks = [tuple(a[s:s + size, ...] for a in arrays) for s in range(0, n, size)]
    if threaded:
        parts = host_threads.map_blocks(fn, blocks)
    else:
        parts = [fn(*block) for block in blocks]
    if isinstance(parts[0], tuple):
        return tuple(xp.concat(p, axis=0) for p in zip(*parts))
    return xp.concat(parts, axis=0)


def slotwise(xp, fn, count, rowwise, slotted, fills, slots=None):
    """``fn(count, *rowwise, *slotted)`` (by :func:`blockwise`), eagerly on NumPy and
    torch on the first ``slots`` (default ``settings().narrow``) slots of every row, then
    again on all slots of the few rows with more vertices.

    For kernels over cells of ``V`` vertex slots (most of them empty) that read the
    slots ``k < count`` of ``slotted`` (arrays ``(n, V, ...)``) and nothing beyond, and
    run on any ``count`` (the narrow pass sees at most ``settings().narrow``). ``fills``
    says, per output of ``fn``, what its slots beyond the narrow ones hold in the narrow
    rows: None for an output per row ``(n, ...)``, a scalar, or an array of the output's
    shape to copy them from. With the fills that ``fn`` writes there, the result is
    ``fn``'s on all rows. It pays: most cells have at most ``narrow`` vertices, and a kernel
    on the narrow slots takes about half the time of one on all.
    """
    n, cap = slotted[0].shape[:2]
    slots = host_threads.settings().narrow if slots is None else slots
    if cap <= slots or not (aac.is_numpy_array(count) or aac.is_torch_array(count)):
        return blockwise(xp, fn, count, *rowwise, *slotted)
    wide = count > slots
    if 2 * int(xp.sum(xp.astype(wide, xp.int64))) > n:     # mostly wide: a narrow pass does not pay
        return blockwise(xp, fn, count, *rowwise, *slotted)
    first = blockwise(xp, fn, xp.minimum(count, slots), *rowwise, *(a[:, :slots, ...] for a in slotted))
    rows = xp.nonzero(wide)[0]
    again = (None,) * len(fills)
    if rows.shape[0]:
        again = _as_tuple(blockwise(xp, fn, xp.take(count, rows), *(xp.take(a, rows, axis=0) for a in rowwise),
                                    *(xp.take(a, rows, axis=0) for a in slotted)))
    outputs = []
    for narrow, redone, fill in zip(_as_tuple(first), again, fills):
        if fill is None:                                # its own if the wide rows are written in place
            out = narrow if redone is None else xp.asarray(narrow, copy=True)
        elif isinstance(fill, (bool, int, float)):
            tail = xp.full((n, cap - slots) + tuple(narrow.shape[2:]), fill, dtype=narrow.dtype,
                           device=aac.device(narrow))
            out = xp.concat([narrow, tail], axis=1)
        else:
            out = xp.concat([narrow, fill[:, slots:, ...]], axis=1)
        if redone is not None:
            out[rows, ...] = redone
        outputs.append(out)
    return tuple(outputs) if isinstance(first, tuple) else outputs[0]


def _as_tuple(result):
    return result if isinstance(result, tuple) else (result,)


def in_background(fn, like):
    """``fn()`` on a thread of its own (its blocks run there one after the other, leaving
    the worker threads to the caller) when ``like`` is an eager NumPy array and there are
    threads to spare (``settings().threads``): the caller's host work (a sparse solve, on
    one core) runs meanwhile; :func:`background_result` waits for it. Elsewhere ``fn()`` at once (JAX's
    compiler orders the work itself; on CPU torch a background thread measured no gain:
    box 1e4 solves, paired, median +7 ms in 0.79 s)."""
    if host_threads.settings().threads < 2 or not aac.is_numpy_array(like) or host_threads.in_block():
        return fn()
    return host_threads.start_in_background(fn)


def background_result(handle):
    """The result of :func:`in_background`'s ``fn``."""
    from concurrent.futures import Future

    return handle.result() if isinstance(handle, Future) else handle
