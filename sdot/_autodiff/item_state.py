"""The state of a solve kept per item under ``torch.func`` transforms (the rules read it)."""


class ItemState:
    """The state of a solve under ``torch.func`` transforms, where the solve runs per item
    (one per item of a ``vmap``): ``of(inputs)`` is the state of the item whose inputs (the
    ``inputs`` of :func:`attach`, as plain arrays) are ``inputs``. :func:`attach` and
    :func:`attach_linear` take one as their ``state``; the rules then see the item's."""

    @staticmethod
    def key(inputs):
        """The key of an item: the shapes and bytes of its ``inputs`` (plain tensors: the items of
        ``torch.func`` transforms)."""
        return tuple((tuple(x.shape), x.detach().cpu().numpy().tobytes()) for x in inputs)

    def of(self, inputs):
        """The state of the item of ``inputs`` (a tuple of plain arrays)."""
        raise NotImplementedError
