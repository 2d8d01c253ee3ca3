"""Per-framework gradient plumbing: attach analytic gradients to a forward value.

``attach(value, inputs, state, grad_fn)`` returns ``value`` connected to the
autodiff graph of ``inputs``: ``d value / d inputs[k] = grad_fn(inputs, state,
needs)[k]``. The forward value was computed on :func:`detach`-ed inputs, so no
framework differentiates through the solver. NumPy (and other frameworks
without autodiff) get ``value`` as is.
"""
from __future__ import annotations

import contextlib

import array_api_compat as aac

from .item_state import ItemState
__all__ = ["attach", "attach_linear", "first_order", "detach", "without_autodiff", "released", "transformed",
           "recording", "differentiation_depth", "host_map", "ItemState"]


def transformed(*xs):
    """True if one of ``xs`` is a tensor wrapped by a ``torch.func`` transform (``grad``,
    ``vmap``, ``jvp``, ``jacrev``, ``jacfwd``...): its values are not readable, the solve
    goes through :func:`host_map`."""
    if not any(aac.is_torch_array(x) for x in xs):
        return False
    from ._torch import transformed as transformed_torch

    return transformed_torch(*xs)


def differentiation_depth(*xs):
    """The number of ``torch.func`` differentiating transforms (``grad``, ``jvp``, ``jacrev``,
    ``jacfwd``...) that wrap one of ``xs`` (0 outside ``torch.func`` and on other frameworks):
    sdot's rules give second derivatives of W2^2 and first derivatives of the plan, and a
    deeper nesting must raise, not differentiate a rule's product as a constant."""
    if not any(aac.is_torch_array(x) for x in xs):
        return 0
    from ._torch import differentiation_depth as depth_torch

    return depth_torch(*xs)


def recording(x):
    """Whether autodiff may differentiate, again, what is computed from ``x`` in a backward
    pass: JAX (always), torch while autograd records (``create_graph=True``) or under
    ``torch.func`` transforms."""
    if aac.is_jax_array(x):
        return True
    if aac.is_torch_array(x):
        from ._torch import _recording

        return _recording()
    return False


def host_map(fn, *args):
    """``fn(*args)`` (a tuple of arrays, or None) on the arguments cut from autodiff. Under
    ``torch.func`` transforms, ``fn`` sees plain tensors, one item at a time under ``vmap``
    (the results stacked): the solver and the rules' products run outside the transforms."""
    if any(aac.is_torch_array(a) for a in args):
        from ._torch import host_map as host_map_torch

        return host_map_torch(fn, *args)
    return tuple(fn(*(None if a is None else detach(a) for a in args)))


def detach(x):
    """``x`` cut from the autodiff graph (torch ``detach``, JAX ``stop_gradient``)."""
    if aac.is_torch_array(x):
        return x.detach()
    if aac.is_jax_array(x):
        import jax

        return jax.lax.stop_gradient(x)
    return x


def without_autodiff(xp):
    """Context of a computation whose arrays need no autodiff (the solver's forward
    pass): ``torch.inference_mode`` for torch, which skips autograd's bookkeeping on
    every operation (measured on a 1e3-Dirac solve: 0.176 -> 0.152 s); nothing otherwise.
    Its torch tensors are inference tensors: pass what users get through :func:`released`."""
    if aac.is_torch_namespace(xp):
        import torch

        return torch.inference_mode()
    return contextlib.nullcontext()


def released(x):
    """``x`` as an ordinary array: a torch inference tensor (see :func:`without_autodiff`)
    is copied (it could not be modified in place, nor saved by autograd)."""
    if aac.is_torch_array(x) and x.is_inference():
        return x.clone()
    return x


def attach(value, inputs, state, grad_fn):
    """``value`` with the gradients ``grad_fn(inputs, state, needs)`` attached.

    Parameters
    ----------
    value : 0-d array
        The forward value, computed without autodiff.
    inputs : tuple of arrays
        The differentiable inputs, in the user's graph.
    state : pytree of arrays
        What ``grad_fn`` needs from the forward computation (not differentiated).
    grad_fn : callable
        ``grad_fn(inputs, state, needs) -> tuple`` of arrays shaped like
        ``inputs`` (``None`` where ``needs[k]`` is False). A module-level function.
    """
    if aac.is_torch_array(value):
        from ._torch import attach as attach_torch

        return attach_torch(value, inputs, state, grad_fn)
    if aac.is_jax_array(value):
        from ._jax import attach as attach_jax

        return attach_jax(value, inputs, state, grad_fn)
    return value


def attach_linear(values, inputs, state, rule):
    """``values`` (a tuple of arrays) connected to ``inputs`` by a linear rule: along input
    tangents ``t`` (a tuple, None for zero) the tangents of ``values`` are
    ``rule.jvp(state, t)``, and the cotangents of ``inputs`` for output cotangents ``c`` are
    ``rule.vjp(state, c, needs)`` (None where not ``needs``), its transpose.

    ``rule`` is hashable (a static argument under ``jax.jit``); ``state`` a pytree of arrays
    (not differentiated). torch: an ``autograd.Function`` (backward and forward mode, once
    differentiable); JAX: a ``custom_jvp`` whose tangent map JAX transposes through the
    rule's ``vjp`` (``jax.lax.custom_linear_solve``): ``jvp``, ``grad``, ``jacfwd``, ``jacrev``,
    under ``jit``, ``vmap`` and ``scan``. NumPy gets ``values`` as they are.
    """
    if any(aac.is_torch_array(v) for v in values):
        from ._torch import attach_linear as attach_torch

        return attach_torch(values, inputs, state, rule)
    if any(aac.is_jax_array(v) for v in values):
        from ._jax import attach_linear as attach_jax

        return attach_jax(values, inputs, state, rule)
    return tuple(values)


def first_order(value, inputs, what):
    """``value`` (computed without autodiff), whose derivative with respect to ``inputs`` is
    not implemented: differentiating it raises ``NotImplementedError`` naming ``what``,
    rather than giving zero. Used for gradients that are only known to first order."""
    if aac.is_torch_array(value):
        from ._torch import first_order as first_order_torch

        return first_order_torch(value, inputs, what)
    if aac.is_jax_array(value):
        from ._jax import first_order as first_order_jax

        return first_order_jax(value, inputs, what)
    return value


def not_differentiable(value, inputs, what):
    """``value`` whose derivative with respect to ``inputs`` is not implemented: torch raises
    ``NotImplementedError`` naming ``what`` when it is differentiated backward (:func:`first_order`)
    and gives NaN tangents forward (``torch.func.jacfwd``, which takes every output's, used or
    not); JAX, which differentiates every output of a function too, gets NaN tangents: never a
    silent zero."""
    if aac.is_jax_array(value):
        from ._jax import _nan_if_differentiated

        return value + _nan_if_differentiated(value * 0, tuple(inputs))
    if aac.is_torch_array(value):
        from ._torch import not_differentiable as not_differentiable_torch

        return not_differentiable_torch(value, inputs, what)
    return first_order(value, inputs, what)
