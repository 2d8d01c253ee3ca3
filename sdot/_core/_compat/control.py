"""Control flow that traces under JAX: loops, conditionals, jitted kernels, blocks.

The blocks run on the host's threads with the process's settings (``settings()`` below:
:func:`sdot._host.threads.settings`).
"""
from __future__ import annotations

import array_api_compat as aac

from ..._host import threads as host_threads
from .host import is_traced


def while_loop(cond, body, state):
    """``jax.lax.while_loop`` when the state is traced, a Python loop otherwise."""
    held = [state]
    del state
    return while_loop_taking(cond, body, held)


def while_loop_taking(cond, body, held):
    """:func:`while_loop` from the state in the one-item list ``held``, which it empties: a
    caller that keeps no other reference to the first state lets it go once ``body`` replaces
    it (an argument stays referenced by the caller until the call returns: a Newton solve kept
    its first diagram to the end, 5.6 GB at 1e6 3D seeds)."""
    if is_traced(*_leaves(held[0])):
        import jax

        return jax.lax.while_loop(cond, body, held.pop())
    while bool(cond(held[0])):
        held.append(body(held.pop()))     # only ``body`` holds the old state: it may drop it early
    return held.pop()


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


def _leaves(state):
    if isinstance(state, (tuple, list)):
        return [leaf for item in state for leaf in _leaves(item)]
    if isinstance(state, dict):
        return [leaf for item in state.values() for leaf in _leaves(item)]
    return [state]


def jit_on_jax(*static_argnames):
    """Decorator: run the function under ``jax.jit`` when called with JAX arrays.

    JAX dispatches eager operations one by one and compiles each for each new
    shape; a jitted kernel compiles once per shape. ``xp`` (the first argument)
    and ``static_argnames`` are static. Other frameworks call the function as is. One
    jitted function per setting of ``HostSettings.reachable``: a trace with host callbacks
    serves only the host's route.
    """
    def wrap(fn):
        jitted = {}

        def call(xp, *args, **kwargs):
            if "jax" in getattr(xp, "__name__", ""):
                reachable = host_threads.settings().reachable
                if reachable not in jitted:
                    import inspect

                    import jax

                    names = list(inspect.signature(fn).parameters)
                    nums = (0,) + tuple(names.index(a) for a in static_argnames)
                    jitted[reachable] = jax.jit(fn, static_argnums=nums, static_argnames=static_argnames)
                return jitted[reachable](xp, *args, **kwargs)
            return fn(xp, *args, **kwargs)

        call.__doc__, call.__name__, call.__wrapped__ = fn.__doc__, fn.__name__, fn
        return call
    return wrap


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
