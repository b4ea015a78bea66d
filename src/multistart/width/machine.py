"""Facts of the machine a search runs on: usable cores, cgroup limits, free memory per device.

Read at call time (a container's limits or a job's CPU set can change between runs). The
cgroup readers take the cgroup root and the ``/proc/self/cgroup`` text as arguments, so they
are tested on folders of literal files; both cgroup v2 (one hierarchy) and v1 (one per
controller, where "no limit" is a huge number) are read.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = [
    "CGROUP_ROOT",
    "cgroup_cpu_limit",
    "cgroup_memory_available",
    "device_free_memory",
    "host_available_memory",
    "parse_cpu_max",
    "quota_cores",
    "shared_ram_device_count",
    "usable_cpu_count",
]

# cgroup v1 reports "no limit" as a huge page-rounded number rather than "max".
_V1_UNLIMITED = 2**60
CGROUP_ROOT = Path("/sys/fs/cgroup")


def parse_cpu_max(text: str) -> int | None:
    """Cores allowed by a cgroup v2 ``cpu.max`` line (``"quota period"``); None: no limit.

    >>> parse_cpu_max("max 100000"), parse_cpu_max("150000 100000"), parse_cpu_max("50000")
    (None, 2, 1)
    """
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    period = float(parts[1]) if len(parts) > 1 else 100_000.0
    return quota_cores(float(parts[0]), period)


def quota_cores(quota: float, period: float) -> int | None:
    """Cores a CPU quota allows (rounded up: 1.5 cores can keep two threads busy half the
    time); None when there is no quota (cgroup v1 writes -1).

    >>> quota_cores(-1, 100000), quota_cores(250000, 100000), quota_cores(10000, 100000)
    (None, 3, 1)
    """
    if quota <= 0 or period <= 0:
        return None
    return max(1, math.ceil(quota / period))


def _own_cgroup_paths(proc_cgroup: str) -> dict[str, str]:
    """Controller -> this process's cgroup path, from ``/proc/self/cgroup`` text ("" is v2)."""
    paths = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(","):
                paths[controller] = parts[2]
    return paths


def _cgroup_dirs(root: Path, controller: str, proc_cgroup: str | None) -> list[Path]:
    """Folders whose limits apply to this process: its own cgroup, its ancestors, the root.

    Covers cgroup v2 (one hierarchy at ``root``) and v1 (one per controller, ``root/<ctl>``).
    """
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            proc_cgroup = ""
    own = _own_cgroup_paths(proc_cgroup)
    dirs: list[Path] = []
    for base, key in ((root, ""), (root / controller, controller)):
        rel = Path(own.get(key, "/").lstrip("/"))
        chain = [rel, *rel.parents] if str(rel) != "." else [Path(".")]
        dirs.extend(base / p for p in chain)
    seen, out = set(), []
    for d in dirs:
        if d not in seen and d.is_dir():
            seen.add(d)
            out.append(d)
    return out


def _read_number(path: Path) -> float | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return math.inf
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        return None


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> int | None:
    """Cores the cgroup CPU quota allows this process (the tightest level); None: no quota."""
    limits: list[int | None] = []
    for d in _cgroup_dirs(root, "cpu", proc_cgroup):
        try:
            limits.append(parse_cpu_max((d / "cpu.max").read_text()))
        except (OSError, ValueError, IndexError):
            pass
        quota, period = _read_number(d / "cpu.cfs_quota_us"), _read_number(d / "cpu.cfs_period_us")
        if quota is not None and period is not None:
            limits.append(quota_cores(quota, period))
    known = [x for x in limits if x is not None]
    return min(known) if known else None


def usable_cpu_count() -> int:
    """Cores this process may actually run on: its CPU affinity and its cgroup quota.

    A container, a Slurm cpuset or a CPU quota gives a process fewer cores than the machine
    has; sizing work by ``os.cpu_count()`` there oversubscribes it. Falls back to
    ``os.cpu_count()``, then 1.

    >>> import multistart as ms
    >>> ms.usable_cpu_count() >= 1
    True
    """
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    try:
        quota = cgroup_cpu_limit()
    except OSError:
        quota = None
    if quota is not None:
        n = min(n, quota)
    return max(1, n)


def cgroup_memory_available(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> int | None:
    """Bytes this process's memory cgroup still allows (limit minus usage, the tightest
    level); None when no level sets a limit.

    cgroup v2: ``memory.max`` - ``memory.current``; v1: ``memory.limit_in_bytes`` -
    ``memory.usage_in_bytes`` (where "no limit" is a number near 2**63).
    """
    room = []
    for d in _cgroup_dirs(root, "memory", proc_cgroup):
        for limit_name, usage_name in (
            ("memory.max", "memory.current"),
            ("memory.limit_in_bytes", "memory.usage_in_bytes"),
        ):
            limit = _read_number(d / limit_name)
            if limit is None or not math.isfinite(limit) or limit >= _V1_UNLIMITED:
                continue
            usage = _read_number(d / usage_name) or 0.0
            room.append(max(0, int(limit - usage)))
    return min(room) if room else None


def host_available_memory() -> tuple[int | None, str]:
    """Free host RAM in bytes: the lower of psutil's available memory and the cgroup's room."""
    found = []
    try:
        import psutil

        found.append((int(psutil.virtual_memory().available), "host RAM available (psutil)"))
    except Exception:  # psutil missing or unsupported platform: the cgroup may still tell
        pass
    cgroup = cgroup_memory_available()
    if cgroup is not None:
        found.append((cgroup, "cgroup memory limit"))
    if not found:
        return None, "unknown"
    return min(found)


def device_free_memory(device) -> tuple[int | None, str]:
    """Free memory of ``device`` in bytes and where the figure came from.

    Accelerators report their allocator's pool (``device.memory_stats()``: ``bytes_limit``
    minus ``bytes_in_use``); a CPU device has no such statistics and uses host RAM.
    """
    try:
        stats = device.memory_stats()
    except Exception:  # not implemented on this backend
        stats = None
    if stats and "bytes_limit" in stats:
        free = int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
        return max(0, free), f"{device.platform} memory_stats"
    if device.platform == "cpu":
        return host_available_memory()
    return None, "unknown"


def shared_ram_device_count(devices=None) -> int:
    """How many devices hold their batches in one RAM: the logical CPU devices of
    ``--xla_force_host_platform_device_count`` share the host's memory, while each GPU or TPU
    has its own. A budget read from host RAM is split between them."""
    if devices is None:
        import jax

        try:
            devices = jax.local_devices()
        except RuntimeError:
            return 1
    return max(1, sum(1 for d in devices if d.platform == "cpu"))
