"""Solves over batches: one solve per item, by a loop over the items or one ``jax.vmap``.

A batch of sources (``BatchOfSumOfDiracs``...) is paired with a batch of targets
(``BatchOfPolynomialGrid``...) item by item; a single measure on either side is shared by
every item of the other (broadcast). Traced JAX inputs (under ``jax.jit``, ``jax.vmap``) run
as one ``jax.vmap`` of the single solve over the items' arrays; other inputs (NumPy, torch,
array_api_strict, concrete JAX arrays on the CPU) loop over the items, which keeps each
framework's autodiff graph through every item.
"""
from __future__ import annotations

import array_api_compat as aac

from . import _driver
from ._grid_batches import _BatchOfGrids
from ._measures import _Diracs

__all__ = ["is_batch", "batch_size", "over_items"]


def is_batch(measure):
    """True for a batch of sources or of targets (a leading batch axis)."""
    return isinstance(measure, (_BatchOfGrids, _Diracs)) and measure.batched


def batch_size(name, source, target):
    """The number of items, the common batch size of the batches among ``source`` and ``target``.

    Raises
    ------
    ValueError
        If both are batches of different sizes (the message names the function ``name``).
    """
    sizes = [len(m) if is_batch(m) else None for m in (source, target)]
    if None not in sizes and sizes[0] != sizes[1]:
        raise ValueError(f"{name}: the batch of sources has {sizes[0]} items and the batch of targets "
                         f"{sizes[1]}; pair batches of equal sizes, or one source or one target with a batch")
    return sizes[0] if sizes[0] is not None else sizes[1]


def stacked(measure):
    """``(item, fields)``: an unbatched measure whose attributes ``fields`` keep the leading
    batch axis of ``measure`` (``(measure, ())`` for a single measure)."""
    if not is_batch(measure):
        return measure, ()
    if isinstance(measure, _BatchOfGrids):
        return measure.stacked()
    item = measure[0]
    item._positions, item._weights = measure._positions, measure._weights
    return item, ("_positions", "_weights")


def _item(measure, i):
    return measure[i] if is_batch(measure) else measure


def over_items(solve, source, target, b, keep, per_item=("power_diagram",)):
    """``solve(source_i, target_i)`` for the ``b`` items, stacked along a leading axis.

    Parameters
    ----------
    solve : callable
        Takes an unbatched source and target, returns a dict of arrays (and of the
        entries ``per_item``, pytrees that do not stack).
    keep : tuple of str
        The entries wanted: under ``jax.vmap`` only these are returned (the others are
        not computed); a loop returns every entry (``OtNotConverged`` carries them).
    per_item : tuple of str
        Entries returned as a tuple of ``b`` objects (an item's ``PowerDiagram``).

    Returns
    -------
    dict
        Each entry of shape ``(b, ...)``, or a tuple of ``b`` objects for ``per_item``.
    """
    parts = [stacked(m) for m in (source, target)]
    leaves = [c for item, _ in parts for c in item._tree_flatten()[0]]
    ref = leaves[0]
    if aac.is_jax_array(ref) and _driver.host_views(*leaves) is None:
        return _vmapped(solve, parts, keep, per_item, b)
    results = [solve(_item(source, i), _item(target, i)) for i in range(b)]
    out = {}
    for key in results[0]:
        values = [r[key] for r in results]
        out[key] = tuple(values) if key in per_item else _driver.namespace(*values).stack(values)
    return out


def _vmapped(solve, parts, keep, per_item, b):
    """:func:`over_items` as one ``jax.vmap``: the batched arrays mapped, the shared ones not."""
    import jax

    _driver.compute_dtype(_driver.namespace(parts[0][0]._tree_flatten()[0][0]))   # x64 policy first
    flat, axes = [], []
    for item, fields in parts:
        children, aux = item._tree_flatten()
        names = [f for f, leaf in zip(type(item)._fields, aux[0]) if leaf]
        flat.append((type(item), aux, children))
        axes.append(tuple(0 if name in fields else None for name in names))

    def run(source_children, target_children):
        (source_cls, source_aux, _), (target_cls, target_aux, _) = flat
        out = solve(source_cls._tree_unflatten(source_aux, source_children),
                    target_cls._tree_unflatten(target_aux, target_children))
        return {k: out[k] for k in keep}

    out = jax.vmap(run, in_axes=tuple(axes))(flat[0][2], flat[1][2])
    for key in set(per_item) & set(keep):
        out[key] = tuple(jax.tree_util.tree_map(lambda a, i=i: a[i], out[key]) for i in range(b))
    return out
