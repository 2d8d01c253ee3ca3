"""sdot's objects as JAX pytrees, without importing JAX.

Every class deriving from :class:`JaxPytree` (measures, grids, ``OtPlan``, ``PowerDiagram``)
defines ``_tree_flatten`` / ``_tree_unflatten``. The classes are registered with
``jax.tree_util`` together, the first time one of them is built while JAX is imported, or when
sdot first converts an input to JAX, whichever comes first. Importing sdot never imports JAX,
and sdot installs no import hook: an object built *before* ``import jax`` is registered as soon
as any sdot object is built or any JAX input is met.
"""
from __future__ import annotations

import sys


class JaxPytree:
    """Base class of sdot's JAX pytrees (registers the classes on first use with JAX)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _CLASSES.append(cls)
        if _registered:                       # JAX already in use: register the new class now
            register()

    def __new__(cls, *args, **kwargs):
        if cls not in _registered and "jax" in sys.modules:
            register()
        return super().__new__(cls)


def register():
    """Register every :class:`JaxPytree` class with ``jax.tree_util`` (idempotent)."""
    import jax

    for cls in _CLASSES:
        if cls not in _registered:
            jax.tree_util.register_pytree_node(cls, cls._tree_flatten, cls._tree_unflatten)
            _registered.add(cls)


_CLASSES = []        # every subclass of JaxPytree
_registered = set()  # those registered with jax.tree_util
