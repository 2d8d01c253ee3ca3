"""JAX: a ``jax.custom_jvp`` whose JVP is linear in the tangents.

``d value = sum_k <grad_k, d inputs_k>``, with ``grad_k`` computed from the
primal inputs and the forward ``state``. Forward mode (``jvp``, ``jacfwd``)
uses it directly; reverse mode (``grad``, ``vjp``) by transposition; it works
under ``jit``, ``vmap`` and ``scan``.
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero


@partial(jax.custom_jvp, nondiff_argnums=(0,))
def _attached(grad_fn, value, inputs, state):
    return value


def _attached_jvp(grad_fn, primals, tangents):
    value, inputs, state = primals
    _, d_inputs, _ = tangents
    needs = tuple(not isinstance(d, SymbolicZero) for d in d_inputs)
    grads = jax.lax.stop_gradient(grad_fn(inputs, jax.lax.stop_gradient(state), needs))
    d_value = jnp.zeros((), dtype=value.dtype)
    for g, d, need in zip(grads, d_inputs, needs):
        if need:
            d_value = d_value + jnp.sum(g * d)
    return value, d_value


_attached.defjvp(_attached_jvp, symbolic_zeros=True)


def attach(value, inputs, state, grad_fn):
    """See :func:`sdot._autodiff.attach`."""
    return _attached(grad_fn, value, tuple(inputs), state)
