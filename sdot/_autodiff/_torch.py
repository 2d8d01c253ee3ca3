"""torch: ``torch.autograd.Function``s whose backward is the analytic gradient.

They are written in the ``setup_context`` style with a ``vmap`` staticmethod, so that they
compose with ``torch.func`` (``grad``, ``vmap``, ``jvp``, ``jacrev``, ``jacfwd``, ``hessian``)
as well as with autograd. Under ``torch.func`` the solver's state is an :class:`ItemState`
(the state of each item found from its inputs' values) and the work on it goes through
:func:`host_map`, which sees plain tensors, one item at a time under ``vmap``.
"""
from __future__ import annotations

import torch

from .item_state import ItemState


def transformed(*xs):
    """True if one of the tensors ``xs`` is wrapped by a ``torch.func`` transform (``grad``,
    ``vmap``, ``jvp``...): its values cannot be read, nor solved on, directly."""
    if not torch._C._are_functorch_transforms_active():
        return False
    wrapped = torch._C._functorch.is_functorch_wrapped_tensor
    return any(isinstance(x, torch.Tensor) and wrapped(x) for x in xs)


def differentiation_depth(*xs):
    """How many ``torch.func`` differentiating transforms (``grad``, ``vjp``, ``jacrev``: Grad;
    ``jvp``, ``jacfwd``: Jvp) wrap at least one of the tensors ``xs``: the order of the
    derivatives that may be taken of what is computed from them (``vmap`` levels do not count,
    nor transforms that do not see ``xs``)."""
    if not torch._C._are_functorch_transforms_active():
        return 0
    from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters

    functorch = torch._C._functorch
    kinds = {i.level(): i.key() for i in retrieve_all_functorch_interpreters()}
    grad, jvp, levels = functorch.TransformType.Grad, functorch.TransformType.Jvp, set()
    for x in xs:
        while isinstance(x, torch.Tensor) and (functorch.is_functorch_wrapped_tensor(x) or functorch.is_batchedtensor(x)):
            level = functorch.maybe_get_level(x)
            # a Grad level tracks x only if x requires grad there (tensors lifted from outside do
            # not); a Jvp level's tangent is not visible here: counted whenever it wraps x
            if (kinds.get(level) == grad and x.requires_grad) or kinds.get(level) == jvp:
                levels.add(level)
            x = functorch.get_unwrapped(x)
    return len(levels)


def _recording():
    """Whether autodiff may differentiate what a backward or a jvp builds: autograd while it
    records (``create_graph=True``); always under ``torch.func`` (a ``jacfwd`` of a ``jacrev``
    differentiates a backward that autograd does not record)."""
    return torch.is_grad_enabled() or torch._C._are_functorch_transforms_active()


class _Host(torch.autograd.Function):
    """``fn(*args)`` (plain tensors in, a tuple of tensors out), not differentiated; under
    ``vmap``, one call per item, stacked (each item may be its own solve, of its own shapes)."""

    @staticmethod
    def forward(fn, *args):
        with torch.no_grad():
            return tuple(x.clone() if x.is_inference() else x for x in fn(*args))

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(*output)

    @staticmethod
    def vmap(info, in_dims, fn, *args):
        items = [_Host.apply(fn, *(a if d is None else a.select(d, i) for a, d in zip(args, in_dims[1:])))
                 for i in range(info.batch_size)]
        out = tuple(torch.stack(column) for column in zip(*items))
        return out, (0,) * len(out)


def host_map(fn, *args):
    """See :func:`sdot._autodiff.host_map`: ``fn`` on plain tensors (``None`` passes through,
    in the arguments and the results), per item under ``torch.func.vmap``."""
    pattern = []

    def live(*a):
        out = tuple(fn(*a))
        pattern[:] = [x is not None for x in out]
        return tuple(x for x in out if x is not None)
    cut = tuple(None if a is None else a.detach() for a in args)
    if not transformed(*(a for a in cut if a is not None)):
        return tuple(fn(*cut))
    results = iter(_Host.apply(live, *cut))
    return tuple(next(results) if keep else None for keep in pattern)


def _product(method, state, inputs, args):
    """``method(state, args)`` without autograd; with an :class:`ItemState`, per item (the
    state of each from ``inputs``) through :func:`host_map`."""
    if isinstance(state, ItemState):
        k = len(inputs)
        return host_map(lambda *a: method(state.of(a[:k]), a[k:]), *inputs, *args)
    with torch.no_grad():
        return tuple(method(state, tuple(None if a is None else a.detach() for a in args)))


def _clones(in_dims, *values):
    """The ``vmap`` rule of a forward that clones ``values``."""
    return tuple(v.clone() for v in values), tuple(in_dims)


class _Attach(torch.autograd.Function):
    """``forward`` returns the precomputed value; ``backward`` scales ``grad_fn``'s
    gradients (computed only for the inputs that need them) by the output's, ``jvp`` is their
    product with the input tangents. Under ``create_graph=True`` (or ``torch.func``) autograd
    records ``grad_fn``: a second derivative is that of the gradients ``grad_fn`` builds
    (differentiable ones, see :mod:`sdot._differentiable`)."""

    @staticmethod
    def forward(value, grad_fn, state, *inputs):
        return value.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.grad_fn, ctx.state = inputs[1], inputs[2]
        ctx.set_materialize_grads(False)                # jvp: None for the inputs without a tangent
        ctx.save_for_backward(*inputs[3:])
        ctx.save_for_forward(*inputs[3:])

    @staticmethod
    def backward(ctx, grad_output):
        inputs = ctx.saved_tensors
        needs = ctx.needs_input_grad[3:]
        if grad_output is None:                         # not materialised: a zero
            return (None,) * (3 + len(needs))
        grads = ctx.grad_fn(inputs, ctx.state, needs)      # recorded under create_graph=True
        scaled = tuple(None if g is None or not need else grad_output * g
                       for g, need in zip(grads, needs))
        return (None, None, None) + scaled

    @staticmethod
    def jvp(ctx, *tangents):
        d_inputs = tangents[3:]
        needs = tuple(t is not None for t in d_inputs)
        grads = ctx.grad_fn(ctx.saved_tensors, ctx.state, needs)
        return sum((g * t).sum() for g, t in zip(grads, d_inputs) if t is not None)

    @staticmethod
    def vmap(info, in_dims, value, grad_fn, state, *inputs):
        (out,), (dim,) = _clones(in_dims[:1], value)
        return out, dim


def attach(value, inputs, state, grad_fn):
    """See :func:`sdot._autodiff.attach`."""
    if not transformed(*inputs) and (not any(x.requires_grad for x in inputs) or not torch.is_grad_enabled()):
        return value
    return _Attach.apply(value, grad_fn, state, *inputs)


class _AttachLinear(torch.autograd.Function):
    """``forward`` returns the precomputed values; ``backward`` is the rule's ``vjp``,
    ``jvp`` (forward mode) its ``jvp``. The rule's maps are computed without autograd: where
    autodiff records (``create_graph=True``, ``torch.func``) their results carry a node whose
    derivative raises (a third derivative of W2^2), rather than a silent zero."""

    @staticmethod
    def forward(rule, state, n_values, *args):
        return tuple(v.clone() for v in args[:n_values])

    @staticmethod
    def setup_context(ctx, inputs, output):
        rule, state, n_values = inputs[:3]
        ctx.rule, ctx.state, ctx.n_values = rule, state, n_values
        ctx.save_for_backward(*inputs[3 + n_values:])
        ctx.save_for_forward(*inputs[3 + n_values:])

    @staticmethod
    def backward(ctx, *cotangents):
        needs = ctx.needs_input_grad[3 + ctx.n_values:]
        inputs = ctx.saved_tensors
        grads = _product(lambda state, c: ctx.rule.vjp(state, c, needs), ctx.state, inputs, cotangents)
        if _recording():
            grads = tuple(None if g is None else _FirstOrder.apply(g, _HIGHER, *inputs, *cotangents) for g in grads)
        return (None, None, None) + (None,) * ctx.n_values + tuple(
            None if g is None or not need else g for g, need in zip(grads, needs))

    @staticmethod
    def jvp(ctx, *tangents):
        d_inputs, inputs = tangents[3 + ctx.n_values:], ctx.saved_tensors
        out = _product(ctx.rule.jvp, ctx.state, inputs, d_inputs)
        if not _recording():
            return out
        live = [t for t in d_inputs if t is not None]
        return tuple(_FirstOrder.apply(t, _HIGHER, *inputs, *live) for t in out)

    @staticmethod
    def vmap(info, in_dims, rule, state, n_values, *args):
        return _clones(in_dims[3:3 + n_values], *args[:n_values])


#: What :class:`_AttachLinear` does not differentiate.
_HIGHER = "the plan's derivatives (third derivatives of W2^2)"


def attach_linear(values, inputs, state, rule):
    """See :func:`sdot._autodiff.attach_linear`."""
    if not transformed(*inputs) and (not any(x.requires_grad or _has_forward_tangent(x) for x in inputs)
                                     or not torch.is_grad_enabled()):
        return tuple(values)
    return _AttachLinear.apply(rule, state, len(values), *values, *inputs)


def _has_forward_tangent(x):
    import torch.autograd.forward_ad as fwAD

    try:
        return fwAD.unpack_dual(x).tangent is not None
    except RuntimeError:
        return False


class _FirstOrder(torch.autograd.Function):
    """A value whose derivatives raise (see :func:`sdot._autodiff.first_order`)."""

    @staticmethod
    def forward(value, what, *inputs):
        return value.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.what = inputs[1]

    @staticmethod
    def backward(ctx, grad_output):
        raise NotImplementedError(f"sdot: the derivative of {ctx.what} is not implemented")

    @staticmethod
    def jvp(ctx, *tangents):
        raise NotImplementedError(f"sdot: the derivative of {ctx.what} is not implemented")

    @staticmethod
    def vmap(info, in_dims, value, what, *inputs):
        (out,), (dim,) = _clones(in_dims[:1], value)
        return out, dim


def first_order(value, inputs, what):
    """See :func:`sdot._autodiff.first_order`."""
    if not transformed(*inputs) and (not torch.is_grad_enabled() or not any(x.requires_grad for x in inputs)):
        return value
    return _FirstOrder.apply(value, what, *inputs)


class _NotDifferentiable(_FirstOrder):
    """:class:`_FirstOrder` whose forward-mode tangent is NaN (see
    :func:`sdot._autodiff.not_differentiable`)."""

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.what, ctx.like = inputs[1], (output.shape, output.dtype, output.device)

    @staticmethod
    def jvp(ctx, *tangents):
        shape, dtype, device = ctx.like
        return torch.full(shape, float("nan"), dtype=dtype, device=device)


def not_differentiable(value, inputs, what):
    """See :func:`sdot._autodiff.not_differentiable`."""
    if not transformed(*inputs) and (not torch.is_grad_enabled() or not any(x.requires_grad for x in inputs)):
        return value
    return _NotDifferentiable.apply(value, what, *inputs)
