"""numba, if installed: :func:`njit` compiles a kernel for the host (cached on disk, the GIL
released); without numba the kernels stay plain Python functions that nothing calls.

numba's disk cache knows a kernel's own file, not the files of the kernels it calls (and
inlines): after an edit of :mod:`.polyhedron` alone, :mod:`.cells3d`'s cached kernels would
still run the old clip. The cache of this package is therefore dropped whenever any of its
sources changed (:func:`_drop_stale_cache`; an installed package changes all of its files at
once, and numba then compiles anew anyway).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

try:
    import numba
except ImportError:              # the compiled route is then off (:func:`.enabled`)
    numba = None

HERE = Path(__file__).resolve().parent


def njit(fn=None, *, allocates: bool = False):
    """``fn`` compiled by numba (``cache=True``: once per environment; ``nogil=True``: blocks
    of rows run on the host's threads), or ``fn`` itself without numba.

    Without ``allocates`` the kernel runs without numba's runtime: it makes no array (its
    scratch comes from the caller) and counts no references. With the runtime, every array
    a call passes costs atomic reference counts, which numba did not prune from the hot
    loops: the clipping of 1e4 cells spent 40% of its time in them."""
    if fn is None:
        return lambda f: njit(f, allocates=allocates)
    if numba is None:
        return fn
    return numba.njit(cache=True, nogil=True, error_model="numpy", _nrt=allocates)(fn)


def _drop_stale_cache():
    """Delete this package's cached kernels if its sources are not those they were compiled
    from (a fingerprint of every source file, kept beside the cache)."""
    cache = HERE / "__pycache__"
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(HERE.glob("*.py")))).hexdigest()
    stamp = cache / "sources.sha256"
    try:
        if stamp.exists() and stamp.read_text() == digest:
            return
        for old in list(cache.glob("*.nbi")) + list(cache.glob("*.nbc")):
            old.unlink()
        cache.mkdir(exist_ok=True)
        stamp.write_text(digest)
    except OSError:                # a read-only installation: numba caches elsewhere, by file
        pass


if numba is not None:
    _drop_stale_cache()
