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
    grads = grad_fn(inputs, jax.lax.stop_gradient(state), needs)     # differentiable: second derivatives
    d_value = jnp.zeros((), dtype=value.dtype)
    for g, d, need in zip(grads, d_inputs, needs):
        if need:
            d_value = d_value + jnp.sum(g * d)
    return value, d_value


_attached.defjvp(_attached_jvp, symbolic_zeros=True)


def attach(value, inputs, state, grad_fn):
    """See :func:`sdot._autodiff.attach`."""
    return _attached(grad_fn, value, tuple(inputs), state)


@partial(jax.custom_jvp, nondiff_argnums=(0,))
def _linear(rule, values, inputs, state):
    return values


def _linear_jvp(rule, primals, tangents):
    values, inputs, state = primals
    _, d_inputs, _ = tangents
    needs = tuple(not isinstance(d, SymbolicZero) for d in d_inputs)
    state = jax.lax.stop_gradient(state)
    live = [d for d, need in zip(d_inputs, needs) if need]
    if not live:
        return values, tuple(jnp.zeros_like(v) for v in values)
    # a rule equal by value to an earlier one shares its compiled map; another (it may hold
    # traced state) is traced inline, not kept in a cache
    tangent_map = _tangent_map if getattr(rule, "shared_by_value", False) else _traced_tangent_map
    out = tangent_map(rule, needs, values, state, live)
    # the tangent map is the state's, not differentiated: its derivative is NaN, not a silent 0
    # (JAX differentiates every output, used or not: an error would break jax.hessian of W2^2)
    out = out + _nan_if_differentiated(jnp.zeros_like(out), tuple(inputs))
    return values, tuple(_split(out, values))


def _traced_tangent_map(rule, needs, values, state, live):
    """The tangents of ``values``, ``rule.jvp(state, live tangents)``, flattened, as a
    ``custom_linear_solve`` of the identity whose transpose is ``rule.vjp`` (reverse mode).

    Jitted (:data:`_tangent_map`, ``rule`` and ``needs`` static) for the rules that compare by
    value (``rule.shared_by_value``, :class:`sdot._jax_host.CallbackRule`): eagerly a rule equal
    to an earlier one reuses its compiled program and its transpose, so a new solve compiles
    nothing and JAX's caches do not grow."""
    length = max(sum(d.size for d in live), sum(v.size for v in values))
    dtype = values[0].dtype

    def flat(arrays):
        x = jnp.concatenate([jnp.ravel(a).astype(dtype) for a in arrays])
        return jnp.pad(x, (0, length - x.shape[0]))

    def expand(parts):
        it = iter(parts)
        return tuple(next(it) if need else None for need in needs)

    def forward(_, x):
        return flat(rule.jvp(state, expand(_split(x, live))))

    def transpose(_, x):
        grads = rule.vjp(state, tuple(_split(x, values)), needs)
        return flat([g for g, need in zip(grads, needs) if need])

    return jax.lax.custom_linear_solve(lambda x: x, flat(live), forward, transpose_solve=transpose)


_tangent_map = jax.jit(_traced_tangent_map, static_argnums=(0, 1))


def _split(x, like):
    """``x`` (flat) cut into arrays of the shapes and dtypes of ``like``."""
    out, start = [], 0
    for a in like:
        out.append(jnp.reshape(x[start:start + a.size], a.shape).astype(a.dtype))
        start += a.size
    return out


@jax.custom_jvp
def _nan_if_differentiated(zero, inputs):
    return zero


def _nan_if_differentiated_jvp(primals, tangents):
    zero, _ = primals
    live = any(not isinstance(d, SymbolicZero) for d in tangents[1])
    return zero, jnp.full_like(zero, jnp.nan) if live else jnp.zeros_like(zero)


_nan_if_differentiated.defjvp(_nan_if_differentiated_jvp, symbolic_zeros=True)


_linear.defjvp(_linear_jvp, symbolic_zeros=True)


def attach_linear(values, inputs, state, rule):
    """See :func:`sdot._autodiff.attach_linear`."""
    return _linear(rule, tuple(values), tuple(inputs), state)


@partial(jax.custom_jvp, nondiff_argnums=(0,))
def _first_order(what, value, inputs):
    return value


def _first_order_jvp(what, primals, tangents):
    if any(not isinstance(d, SymbolicZero) for d in tangents[1]):
        raise NotImplementedError(f"sdot: the derivative of {what} is not implemented")
    return primals[0], jnp.zeros_like(primals[0])


_first_order.defjvp(_first_order_jvp, symbolic_zeros=True)


def first_order(value, inputs, what):
    """See :func:`sdot._autodiff.first_order`."""
    return _first_order(what, value, tuple(inputs))
