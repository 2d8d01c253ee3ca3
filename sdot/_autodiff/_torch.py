"""torch: a ``torch.autograd.Function`` whose backward is the analytic gradient."""
from __future__ import annotations

import torch


class _Attach(torch.autograd.Function):
    """``forward`` returns the precomputed value; ``backward`` scales ``grad_fn``'s
    gradients (computed only for the inputs that need them) by the output's. Under
    ``create_graph=True`` autograd records ``grad_fn``: a second derivative is that of the
    gradients ``grad_fn`` builds (differentiable ones, see :mod:`sdot._differentiable`)."""

    @staticmethod
    def forward(ctx, value, grad_fn, state, *inputs):
        ctx.grad_fn, ctx.state = grad_fn, state
        ctx.save_for_backward(*inputs)
        return value.clone()

    @staticmethod
    def backward(ctx, grad_output):
        inputs = ctx.saved_tensors
        needs = ctx.needs_input_grad[3:]
        grads = ctx.grad_fn(inputs, ctx.state, needs)      # recorded under create_graph=True
        scaled = tuple(None if g is None or not need else grad_output * g
                       for g, need in zip(grads, needs))
        return (None, None, None) + scaled


def attach(value, inputs, state, grad_fn):
    """See :func:`sdot._autodiff.attach`."""
    if not any(x.requires_grad for x in inputs) or not torch.is_grad_enabled():
        return value
    return _Attach.apply(value, grad_fn, state, *inputs)


class _AttachLinear(torch.autograd.Function):
    """``forward`` returns the precomputed values; ``backward`` is the rule's ``vjp``,
    ``jvp`` (forward mode) its ``jvp``. The rule's maps are computed without autograd: under
    ``create_graph=True`` their results carry a node whose derivative raises (a third
    derivative of W2^2), rather than a silent zero."""

    @staticmethod
    def forward(ctx, rule, state, n_values, *args):
        ctx.rule, ctx.state, ctx.n_values = rule, state, n_values
        ctx.save_for_backward(*args[n_values:])
        return tuple(v.clone() for v in args[:n_values])

    @staticmethod
    def backward(ctx, *cotangents):
        needs = ctx.needs_input_grad[3 + ctx.n_values:]
        recording = torch.is_grad_enabled()
        with torch.no_grad():
            grads = ctx.rule.vjp(ctx.state, tuple(c.detach() for c in cotangents), needs)
        if recording:
            inputs = ctx.saved_tensors
            grads = tuple(None if g is None else _FirstOrder.apply(g, _HIGHER, *inputs, *cotangents) for g in grads)
        return (None, None, None) + (None,) * ctx.n_values + tuple(
            None if g is None or not need else g for g, need in zip(grads, needs))

    @staticmethod
    def jvp(ctx, *tangents):
        d_inputs = tangents[3 + ctx.n_values:]
        with torch.no_grad():
            return tuple(ctx.rule.jvp(ctx.state, d_inputs))


#: What :class:`_AttachLinear` does not differentiate.
_HIGHER = "the plan's derivatives (third derivatives of W2^2)"


def attach_linear(values, inputs, state, rule):
    """See :func:`sdot._autodiff.attach_linear`."""
    if not any(x.requires_grad or _has_forward_tangent(x) for x in inputs) or not torch.is_grad_enabled():
        return tuple(values)
    return _AttachLinear.apply(rule, state, len(values), *values, *inputs)


def _has_forward_tangent(x):
    import torch.autograd.forward_ad as fwAD

    try:
        return fwAD.unpack_dual(x).tangent is not None
    except RuntimeError:
        return False


class _FirstOrder(torch.autograd.Function):
    """A value whose backward raises (see :func:`sdot._autodiff.first_order`)."""

    @staticmethod
    def forward(ctx, value, what, *inputs):
        ctx.what = what
        return value.clone()

    @staticmethod
    def backward(ctx, grad_output):
        raise NotImplementedError(f"sdot: the derivative of {ctx.what} is not implemented")


def first_order(value, inputs, what):
    """See :func:`sdot._autodiff.first_order`."""
    if not torch.is_grad_enabled() or not any(x.requires_grad for x in inputs):
        return value
    return _FirstOrder.apply(value, what, *inputs)
