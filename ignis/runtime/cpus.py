"""How many threads the kernels get by default: the CPUs this process may actually use.

os.cpu_count() counts the machine; a process pinned with taskset, or in a container with a CPU
quota (cgroup v2 cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us), gets fewer, and more
threads than that only wait on each other. The default is the smallest of the affinity mask and
the quota, rounded up, and at least 1.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (os.cpu_count() where there is no such mask)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _v2_quota(line: str) -> float | None:
    """cpu.max is "<quota> <period>" or "max <period>"."""
    parts = line.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _v1_quota(directory: Path) -> float | None:
    quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
    try:
        q, p = int(quota or ""), int(period or "")
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def cgroup_cpus(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> float | None:
    """The CPU quota of this process's cgroup and its ancestors, in CPUs (the tightest), or None
    when there is none. v2: cpu.max along the process's path from /proc/self/cgroup up to the
    root; v1: cpu.cfs_quota_us / cpu.cfs_period_us under the cpu controller's mount."""
    limits: list[float] = []
    own = _read(proc_cgroup) or ""
    for line in own.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, rel = rest.partition(":")
        rel = rel.lstrip("/")
        if hier == "0" and controllers == "":                       # v2 unified hierarchy
            d = root / rel if rel else root
            while True:
                got = _v2_quota(_read(d / "cpu.max") or "")
                if got is not None:
                    limits.append(got)
                if d == root or root not in d.parents:
                    break
                d = d.parent
        elif "cpu" in controllers.split(","):                        # v1 cpu controller
            for mount in (root / "cpu", root / "cpu,cpuacct", root / "cpuacct,cpu"):
                for d in (mount / rel, mount):
                    got = _v1_quota(d)
                    if got is not None:
                        limits.append(got)
    if not own:       # no /proc/self/cgroup: the root's files alone (a container's namespace)
        for got in (_v2_quota(_read(root / "cpu.max") or ""), _v1_quota(root / "cpu")):
            if got is not None:
                limits.append(got)
    return min(limits) if limits else None


def available_cpus(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int:
    """The default thread count: min(affinity mask, ceil(cgroup quota)), at least 1."""
    n = affinity_cpus()
    quota = cgroup_cpus(root, proc_cgroup)
    if quota is not None:
        n = min(n, max(1, math.ceil(quota - 1e-9)))
    return max(1, n)
