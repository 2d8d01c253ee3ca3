"""JAX's persistent compilation cache, opt-in by ``sdot.driver.jax_cache`` (``$SDOT_JAX_CACHE``).

When on, JAX writes the programs it compiles (that took at least :data:`MIN_COMPILE_SECONDS`
to compile) to a directory, and a later process loads them instead of compiling again.

What it serves: JAX stores no program that calls back into Python (``jax.pure_callback``,
``jax.debug.callback``). sdot's jitted solves on the CPU call back (the whole NumPy core on the
callback route, the default; scipy's k-d tree, Qhull and SuperLU on the compiled route), so
they are never stored; the compiled route where no host is reached (arrays on a GPU or TPU)
is, and so are the user's own callback-free programs.

Trust model: the cache holds machine code that JAX loads and runs. Anyone who can write to
the directory can run code in every process that uses it. sdot therefore creates it with
mode 0700 (the default ``~/.cache/sdot/jax/<hostname>``, per user and per host: compiled
code is specific to a machine's CPU), and refuses a directory that another user owns or
that others may write to. Do not point it to a shared directory.
"""
from __future__ import annotations

import os
import socket
import stat
import sys
from pathlib import Path

#: Programs that compile faster than this are not stored (JAX's own default).
MIN_COMPILE_SECONDS = 1.0

_ON = ("1", "true", "on", "yes")
_OFF = ("", "0", "false", "off", "no", "none")
#: What sdot changed in JAX's configuration (restored when the cache is turned off).
_applied = {"dir": None, "saved": None}


def default_directory() -> Path:
    """``$XDG_CACHE_HOME/sdot/jax/<hostname>`` (``~/.cache`` without ``$XDG_CACHE_HOME``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sdot" / "jax" / socket.gethostname()


def directory(value):
    """The cache directory of the setting ``value`` (None, a boolean, "1"/"0"..., or a path),
    created private (0700) and checked, or None for off.

    Raises
    ------
    ValueError
        If the directory cannot be created, is owned by another user, or is writable by its
        group or by others.
    """
    if value is None or value is False:
        return None
    text = str(value).strip()
    if value is True or text.lower() in _ON:
        path = default_directory()
    elif text.lower() in _OFF:
        return None
    else:
        path = Path(text).expanduser()
    path = path.absolute()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"sdot.driver.jax_cache: cannot create {str(path)!r} ({err})") from None
    info = path.stat()
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise ValueError(f"sdot.driver.jax_cache: {str(path)!r} belongs to another user; JAX runs the code "
                         "it holds: use a directory of your own")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ValueError(f"sdot.driver.jax_cache: {str(path)!r} is writable by other users, who could put code "
                         f"there that JAX would run: make it private (chmod 700 {str(path)!r}) or choose another")
    return str(path)


def apply(path):
    """Point JAX's persistent cache at ``path`` (None: turn off what sdot turned on). Needs JAX
    imported; called when the setting changes and when sdot first meets JAX."""
    jax = sys.modules.get("jax")
    if jax is None or path == _applied["dir"]:
        return
    config = jax.config
    if path is None:
        config.update("jax_compilation_cache_dir", _applied["saved"])
    else:
        if _applied["dir"] is None:
            _applied["saved"] = config.jax_compilation_cache_dir
        config.update("jax_compilation_cache_dir", path)
        config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
        config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    _applied["dir"] = path
    try:                                    # JAX reads the directory once: start again
        from jax.experimental.compilation_cache import compilation_cache

        compilation_cache.reset_cache()
    except (ImportError, AttributeError):   # pragma: no cover (other JAX versions)
        pass
