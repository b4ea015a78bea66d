"""Where multistart keeps files between runs, and JAX's persistent compilation cache.

``cache_dir()`` is ``MULTISTART_CACHE_DIR`` when set (an empty value disables caching), else
``$XDG_CACHE_HOME/multistart`` or ``~/.cache/multistart``.

:func:`configure_compilation_cache` turns JAX's persistent compilation cache on, once per
process, at the first fit (never at import): compiled programs go to ``cache_dir() / "jax"``, so
a second process fitting the same model loads its chunk step and filter instead of compiling
them. A cache the user configured for JAX (``JAX_COMPILATION_CACHE_DIR`` or
``jax.config.update("jax_compilation_cache_dir", ...)``) is used as it is, and
``jax_enable_compilation_cache=False`` is obeyed.

JAX only writes programs that took at least ``jax_persistent_cache_min_compile_time_secs``
(default 1 s) to compile; a small model's chunk step compiles faster than that and would never
be cached. Unless the user set them, the threshold is lowered to 0 s and the entry-size
threshold to -1 (no size limit, and no filesystem-specific override) for the whole process,
so the user's own later compiles are cached too (``jax_compilation_cache_max_size`` bounds the
folder).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = ["cache_dir", "CacheSetup", "configure_compilation_cache", "cache_setup", "plan_cache"]

_ENV = "MULTISTART_CACHE_DIR"
# JAX's own defaults; a value different from these was set by the user and is left alone.
_JAX_MIN_COMPILE_TIME_S = 1.0
_JAX_MIN_ENTRY_SIZE = 0


def cache_dir() -> Path | None:
    """The cache folder (not created here), or ``None`` when caching is disabled."""
    env = os.environ.get(_ENV)
    if env is not None:
        return Path(env).expanduser() if env.strip() else None
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "multistart"


@dataclass(frozen=True)
class CacheSetup:
    """What :func:`configure_compilation_cache` decided.

    Attributes:
      path: where compiled programs are kept, or ``None`` when the cache is off.
      source: ``"multistart"`` (our folder), ``"user"`` (a folder the user gave JAX), or
        ``"off"``.
      reason: one line for the log.
      min_compile_time_s: JAX's write threshold in effect after set-up.
      min_entry_size_bytes: JAX's entry-size threshold in effect after set-up.
    """

    path: str | None
    source: str
    reason: str
    min_compile_time_s: float | None = None
    min_entry_size_bytes: int | None = None


def plan_cache(enabled: bool, jax_dir: str | None, ours: Path | None) -> tuple[str | None, str]:
    """Which folder to use: ``(path, source)``, without touching JAX (the precedence rules).

    ``enabled`` is ``jax_enable_compilation_cache``, ``jax_dir`` the folder JAX is already
    configured with (from ``JAX_COMPILATION_CACHE_DIR`` or the user's code), ``ours`` is
    :func:`cache_dir`.

    >>> plan_cache(True, None, Path("/c/multistart"))
    ('/c/multistart/jax', 'multistart')
    >>> plan_cache(True, "/mine", Path("/c/multistart"))
    ('/mine', 'user')
    >>> plan_cache(True, None, None), plan_cache(False, "/mine", Path("/c"))
    ((None, 'off'), (None, 'off'))
    """
    if not enabled:
        return None, "off"
    if jax_dir:
        return str(jax_dir), "user"
    if ours is None:
        return None, "off"
    return str(ours / "jax"), "multistart"


_lock = threading.Lock()
_setup: CacheSetup | None = None


def cache_setup() -> CacheSetup | None:
    """The set-up made in this process, or ``None`` before the first fit."""
    return _setup


def configure_compilation_cache() -> CacheSetup:
    """Set up JAX's persistent compilation cache once per process; later calls return the same.

    Never raises over a cache problem: a folder that cannot be created turns the cache off for
    this process, with a warning in the log.
    """
    global _setup
    with _lock:
        if _setup is None:
            _setup = _configure()
            from ..common import log

            log.logger.debug("compilation cache: %s", _setup.reason)
        return _setup


def _configure() -> CacheSetup:
    import jax

    from ..common import log

    enabled = bool(jax.config.jax_enable_compilation_cache)  # type: ignore[attr-defined]  # a dynamic option
    jax_dir = jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined]  # a dynamic option
    ours = cache_dir()
    path, source = plan_cache(enabled, jax_dir, ours)
    if source == "off":
        why = "jax_enable_compilation_cache is False" if not enabled else f"{_ENV} is empty"
        return CacheSetup(None, "off", f"off ({why}); every process compiles afresh")
    if source == "multistart":
        assert path is not None  # plan_cache gives a folder with this source
        try:
            Path(path).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            log.logger.warning("compilation cache: cannot create %s (%s); cache off", path, e)
            return CacheSetup(None, "off", f"off (cannot create {path})")
        jax.config.update("jax_compilation_cache_dir", path)
        _let_jax_reconsider()
    min_time, min_size = _lower_thresholds()
    where = "set by the user for JAX" if source == "user" else f"{_ENV} or the user cache folder"
    reason = (
        f"{path} ({where}; programs compiled in >= {min_time:g} s are kept, "
        f"entry size threshold {min_size})"
    )
    return CacheSetup(path, source, reason, min_time, min_size)


def _lower_thresholds() -> tuple[float, int]:
    """Cache even quickly compiled programs, unless the user chose the thresholds."""
    import jax

    t_env, s_env = (
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES",
    )
    min_time = jax.config.jax_persistent_cache_min_compile_time_secs  # type: ignore[attr-defined]  # a dynamic option
    if t_env not in os.environ and min_time == _JAX_MIN_COMPILE_TIME_S:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        min_time = 0.0
    min_size = jax.config.jax_persistent_cache_min_entry_size_bytes  # type: ignore[attr-defined]  # a dynamic option
    if s_env not in os.environ and min_size == _JAX_MIN_ENTRY_SIZE:
        # -1: no size limit, and JAX may not raise it for the filesystem (0 allows that).
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
        min_size = -1
    return float(min_time), int(min_size)


def _let_jax_reconsider() -> None:
    """Make JAX re-decide whether it uses the cache, if it already decided without one.

    JAX decides once per process, at its first compile, whether the persistent cache is used
    (``compilation_cache.is_cache_used``) and keeps the answer. If that first compile happened
    while the cache was disabled, setting a folder now would be silently ignored, so the
    decision is reset (``reset_cache``, public API). If the first compile merely found no
    folder, JAX still opens the cache lazily at the next compile, and nothing is reset.
    """
    from jax._src import compilation_cache as _cc
    from jax.experimental.compilation_cache import compilation_cache as cc

    checked = getattr(_cc, "_cache_checked", True)
    used = getattr(_cc, "_cache_used", False)
    initialized = getattr(_cc, "_cache_initialized", True)
    if (checked and not used) or initialized:
        cc.reset_cache()
