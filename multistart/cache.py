"""Where multistart keeps files between runs (the persistent compilation cache, tuning records).

``MULTISTART_CACHE_DIR`` moves the folder; an empty value disables caching. Otherwise it is
``$XDG_CACHE_HOME/multistart`` or ``~/.cache/multistart``.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]

_ENV = "MULTISTART_CACHE_DIR"


def cache_dir() -> Path | None:
    """The cache folder (not created here), or ``None`` when caching is disabled."""
    env = os.environ.get(_ENV)
    if env is not None:
        return Path(env).expanduser() if env.strip() else None
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "multistart"
