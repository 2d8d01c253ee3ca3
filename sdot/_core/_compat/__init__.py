"""The few primitives the array API standard lacks and the solver needs.

Every function takes the namespace ``xp`` and arrays of it, and has a pure
array-API fallback (exercised by the ``array_api_strict`` test backend).
Platform accelerations (scipy's cKDTree, Qhull and sparse LU, ``np.bincount``,
``Tensor.index_add``, ``jax.ops.segment_sum``) are used when the arrays live
on the CPU and are concrete (not traced); the host-only ones (NumPy in, NumPy out:
scipy, the thread pools) are in :mod:`sdot._host`, called here on NumPy views.

This is the only package of ``sdot._core`` that may import a framework:

- :mod:`.host`: tracing, NumPy views and host callbacks;
- :mod:`.arrays`: scatter-add, row gathers and writes, sizes;
- :mod:`.control`: loops and conditionals that trace, jitted kernels;
- :mod:`.namespaces`: the namespace the solver computes with.
"""
from .arrays import (bucket, capacity, column, dot, first_columns, flat_take, hits, put_rows, remainder, row_all, row_any,
                     row_gather, row_max, row_min, row_sum, rows_where, segment_sum, select, set_rows, true_entries)
from .control import cond, fori_loop, jit_on_jax, while_loop, while_loop_taking
from .host import (compiled_call, from_host, host_any, host_call, host_share, host_view, is_traced, known_none, on_host, static_shapes,
                   to_int)
from .namespaces import namespace

__all__ = [
    "remainder", "segment_sum", "while_loop", "while_loop_taking", "fori_loop", "cond", "column", "to_int", "host_call",
    "is_traced", "on_host", "from_host", "compiled_call", "host_any", "host_share", "bucket", "capacity", "set_rows", "jit_on_jax",
    "namespace", "dot", "first_columns", "flat_take", "select", "true_entries", "rows_where", "static_shapes", "host_view", "known_none", "put_rows", "row_gather", "hits",
    "row_sum", "row_max", "row_min", "row_any", "row_all",
]
