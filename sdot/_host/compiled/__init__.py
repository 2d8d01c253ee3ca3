"""Compiled host kernels: numba, NumPy in and NumPy out (the design rule: the hottest host-side
kernels may be compiled at run time, the array-API route staying the oracle).

Where the array-API kernels are the bottleneck on the CPU, these replace them on concrete host
arrays (NumPy, CPU torch tensors and eager CPU JAX arrays, on NumPy views); the array-API
kernels stay the route under ``jax.jit``, on GPUs and on ``array_api_strict``, and the oracle the
tests compare these with.

- :mod:`.polyhedron`: one convex polyhedron in scratch arrays, clipped and integrated;
- :mod:`.tree`: a k-d tree of the seeds with the largest weight under each node;
- :mod:`.cells3d`: the power cells in 3D, each clipped on its own;
- :mod:`.integrals3d`: exact integrals of a voxel density over them.

Like :mod:`sdot._host`, the modules import only the standard library, NumPy and
numba, and never see an ``xp`` namespace. Kernels are compiled once per environment and
cached on disk; without numba (an optional dependency) the array-API kernels run and
:func:`enabled` warns once.
"""
from __future__ import annotations

import warnings

from .. import threads as host_threads
from ._numba import numba


class PerformanceWarning(UserWarning):
    """The solver runs a slower route than it could (see the message)."""


_warned = []


def enabled() -> bool:
    """Whether the compiled kernels run: numba is installed and ``HostSettings.compiled``
    (``sdot.driver.compiled``, ``$SDOT_COMPILED``) is on. Without numba, a :class:`PerformanceWarning`
    says once how to get them."""
    if not host_threads.settings().compiled:
        return False
    if numba is None:
        if not _warned:
            _warned.append(True)
            warnings.warn("sdot: numba is not installed, so the solver runs its array-API kernels on the CPU "
                          "(3D solves several times slower); `pip install numba` (or the extra sdot-xp[fast]) "
                          "for its compiled kernels", PerformanceWarning, stacklevel=3)
        return False
    return True


def ranges(n, fewest=512, per_thread=4):
    """The rows ``0 .. n - 1`` as ranges ``(first, last)`` of at least ``fewest`` rows, a few per
    thread of the host (rows vary in cost)."""
    threads = host_threads.settings().threads
    parts = max(1, min(per_thread * threads, -(-n // fewest)))
    edges = [n * k // parts for k in range(parts + 1)]
    return [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def run_ranges(kernel, parts):
    """``kernel(k, first, last)`` for each range ``k`` of ``parts`` on the host's threads (in
    this thread alone inside a block, or with one thread)."""
    if host_threads.settings().threads == 1 or len(parts) <= 1 or host_threads.in_block():
        for k, (a, b) in enumerate(parts):
            kernel(k, a, b)
    else:
        host_threads.map_on_threads(lambda item: kernel(item[0], *item[1]), list(enumerate(parts)))


def run_rows(kernel, n, fewest=512, per_thread=4):
    """``kernel(first, last)`` over the rows ``0 .. n - 1`` (:func:`ranges`, :func:`run_ranges`)."""
    run_ranges(lambda k, a, b: kernel(a, b), ranges(n, fewest, per_thread))
