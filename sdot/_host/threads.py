"""The host's threads: the process's settings of the eager kernels, the thread pools."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

#: The thread that runs the host functions of traced code (Qhull, cKDTree, SuperLU), started
#: at import with the process's floating-point environment and stack: XLA's worker threads
#: flush denormals to zero, and there cKDTree recursed until its stack overflowed (segfault).
HOST_THREAD = ThreadPoolExecutor(1, thread_name_prefix="sdot-host")
HOST_THREAD.submit(int).result()


def _cores() -> int:
    return min(os.cpu_count() or 1, 8)


@dataclasses.dataclass(frozen=True)
class HostSettings:
    """How the eager NumPy and torch kernels run: in blocks of rows, on threads, in chunks.

    Settings of the process, not options of a solve: every kernel of the core runs through
    ``row_blocks.blockwise`` or ``row_blocks.slotwise``, and each gives the same result whatever the
    blocks and slots (the tests compare them). The threads also set the fewest tiles of the
    host's regular triangulation (:func:`.triangulation.tiled_rings`): results may differ
    in the last bits from one thread count to another. Read by :func:`settings`; changed for
    a ``with`` block by :func:`host_settings`.
    """

    #: Threads running the blocks of NumPy kernels (NumPy releases the GIL in its loops;
    #: torch runs its own threads): ``sdot.driver.threads``, default the cores, at most 8.
    threads: int = dataclasses.field(default_factory=_cores)
    #: Rows per block of the eager kernels: their temporaries stay in the CPU caches.
    block: int = 16384
    #: Fewest rows per block worth a thread.
    min_block: int = 2048
    #: Whether the compiled host kernels (:mod:`sdot._host.compiled`, numba) run where they
    #: can: ``sdot.driver.compiled`` (default on; off, the array-API kernels run on the host too).
    compiled: bool = True
    #: Whether torch and JAX arrays on the CPU reach the host (NumPy views, host callbacks
    #: under ``jax.jit``, the compiled kernels): ``sdot.driver.host`` (default on). Off, they take
    #: the array-API route that a GPU takes, on the CPU (NumPy arrays are the host's own).
    reachable: bool = True
    #: Vertex slots of the narrow pass of ``row_blocks.slotwise`` (98% of the cells of uniform
    #: seeds have at most 8 vertices, all but 0.03% at most 10).
    narrow: int = 8
    #: Triangles per chunk of the eager 3D integrals over voxels (the temporaries of a chunk's
    #: pieces stay in the CPU caches; NumPy, one thread, 4e4 of 1e5 Voronoi cells on a 32^3
    #: grid: chunks of 4096 triangles 2.3 s, 8192 1.9 s, 16384 1.7 s; a block of 1e4 cells at
    #: once, 5e5 triangles and 4e6 pieces, 3-5x slower than in chunks).
    triangle_chunk: int = 16384
    #: Triangles per chunk of the closed forms on a (1, 1, 1) grid (no pieces; 1e5 cells: 0.65 s
    #: in chunks of 4096, 0.47 s of 16384, 0.41 s of 65536, 0.68 s of 262144).
    uniform_triangle_chunk: int = 65536
    #: Pieces per slice of the eager 3D Bernstein kernels.
    piece_slice: int = 8192
    #: The eager 2D integrals over pixels look for cells in one pixel from this many cells per
    #: pixel (at 2.4, 1e4 cells on 64x64 pixels, 6% of them lie in one; at 7.3, 29%; at 24,
    #: 55%), and integrate them apart (in closed form) when they are this share of the cells.
    cells_per_pixel: float = 4.0
    one_pixel_share: float = 0.2


_settings = [HostSettings()]
_pool = []
_background = []
_in_block = threading.local()


def settings() -> HostSettings:
    """The :class:`HostSettings` in force."""
    return _settings[-1]


@contextlib.contextmanager
def host_settings(**changes):
    """Within the ``with`` block, the :class:`HostSettings` with the fields ``changes``
    (for the whole process: tests and benchmarks, not concurrent solves)."""
    _settings.append(dataclasses.replace(settings(), **changes))
    try:
        yield settings()
    finally:
        _settings.pop()


def configure(**changes):
    """The fields ``changes`` of the process's :class:`HostSettings`, for good (at every level
    of :func:`host_settings` blocks in force): the driver's settings that live here (``threads``,
    ``compiled``, ``reachable``; the environment is read by the driver). A new thread count
    makes a new pool of threads."""
    if "threads" in changes and _pool and changes["threads"] != settings().threads:
        _pool.pop().shutdown(wait=False)
    _settings[:] = [dataclasses.replace(s, **changes) for s in _settings]


def block_rows(n: int, threads: int) -> int:
    """Rows per block: at most ``settings().block``, as many blocks as a multiple of
    ``threads`` of equal size, none under ``settings().min_block`` rows."""
    now = settings()
    blocks = max(-(-n // now.block), 1)             # no rows: one empty block
    blocks = -(-blocks // threads) * threads
    return max(-(-n // blocks), now.min_block)


def in_block() -> bool:
    """True on a thread running a block (of :func:`map_blocks` or :func:`start_in_background`):
    its kernels run their own blocks there, one after the other."""
    return getattr(_in_block, "busy", False)


def map_blocks(fn, blocks):
    """``[fn(*block) for block in blocks]`` on the worker threads, each call marked as
    :func:`in_block`."""
    return list(_threads().map(lambda block: _run_block(fn, block), blocks))


def map_on_threads(fn, items):
    """``[fn(item) for item in items]`` on the worker threads (for host work that releases
    the GIL, like NumPy kernels or Qhull)."""
    return list(_threads().map(fn, items))


def start_in_background(fn) -> Future:
    """``fn()`` on the background thread (a thread of its own, marked as :func:`in_block`):
    the future of its result."""
    return _executor(_background, 1, "sdot-background").submit(_run_block, fn, ())


def _threads():
    return _executor(_pool, settings().threads, "sdot")


def _executor(holder, workers, prefix):
    """The thread pool kept in the list ``holder``, made on first use."""
    if not holder:
        holder.append(ThreadPoolExecutor(workers, thread_name_prefix=prefix))
    return holder[0]


def _run_block(fn, block):
    _in_block.busy = True
    try:
        return fn(*block)
    finally:
        _in_block.busy = False
