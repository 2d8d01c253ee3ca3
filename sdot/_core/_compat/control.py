"""Control flow that traces under JAX: loops, conditionals, jitted kernels."""
from __future__ import annotations

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
