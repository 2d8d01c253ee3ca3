"""torch: a ``torch.autograd.Function`` whose backward is the analytic gradient."""
from __future__ import annotations

import torch


class _Attach(torch.autograd.Function):
    """``forward`` returns the precomputed value; ``backward`` scales ``grad_fn``'s
    gradients (computed only for the inputs that need them) by the output's."""

    @staticmethod
    def forward(ctx, value, grad_fn, state, *inputs):
        ctx.grad_fn, ctx.state = grad_fn, state
        ctx.save_for_backward(*inputs)
        return value.clone()

    @staticmethod
    def backward(ctx, grad_output):
        inputs = ctx.saved_tensors
        needs = ctx.needs_input_grad[3:]
        with torch.no_grad():
            grads = ctx.grad_fn(inputs, ctx.state, needs)
        scaled = tuple(None if g is None or not need else grad_output * g
                       for g, need in zip(grads, needs))
        return (None, None, None) + scaled


def attach(value, inputs, state, grad_fn):
    """See :func:`sdot._autodiff.attach`."""
    if not any(x.requires_grad for x in inputs) or not torch.is_grad_enabled():
        return value
    return _Attach.apply(value, grad_fn, state, *inputs)
