"""How many CPU threads torch should use, from the cores this process may actually run on.

torch's default is the machine's physical core count, whatever else is running: on a 2-core
machine with another job busy, two threads each wait for a descheduled partner and training ran
4x slower than with one thread (measured: 0.55-1.15 kB/s vs 4.05 kB/s). The default here is

    cores available (CPU affinity, capped by a cgroup CPU quota) - cores busy with other work,

at least 1, where "busy" is the number of other runnable threads on the machine right now (the
kernel's count in /proc/loadavg, minimum of a few samples over 0.1 s, so a job that just
finished, e.g. the pip install before the README's first command, does not count). An explicit
``--threads N`` or ``OMP_NUM_THREADS`` wins.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass


@dataclass
class ThreadChoice:
    threads: int
    available: int  # cores this process may use
    busy: int  # of those, busy with other work when we looked
    source: str  # "--threads", "OMP_NUM_THREADS" or "available cores"

    def describe(self) -> str:
        if self.source != "available cores":
            return f"threads: {self.threads} (from {self.source})"
        return (f"threads: {self.threads} ({self.available} core{'s' if self.available != 1 else ''} "
                f"available, {self.busy} busy with other work; --threads N to choose)")


CGROUP_V2 = "/sys/fs/cgroup/cpu.max"
CGROUP_V1 = "/sys/fs/cgroup/cpu"
LOADAVG = "/proc/loadavg"


def _cgroup_quota() -> float | None:
    """CPUs allowed by a cgroup CPU quota (v2 cpu.max or v1 cfs), None when unlimited."""
    try:
        with open(CGROUP_V2) as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            return int(quota) / int(period)
        return None
    except (OSError, ValueError):
        pass
    try:
        with open(os.path.join(CGROUP_V1, "cpu.cfs_quota_us")) as f:
            quota = int(f.read())
        with open(os.path.join(CGROUP_V1, "cpu.cfs_period_us")) as f:
            period = int(f.read())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def available_cores() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        n = min(n, max(1, math.floor(quota)))
    return max(1, n)


def busy_cores(samples: int = 4, interval: float = 0.03) -> int:
    """Runnable threads other than this one, right now (min over a few samples); 0 if unknown."""
    counts = []
    for i in range(samples):
        try:
            with open(LOADAVG) as f:
                running = int(f.read().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return 0
        counts.append(max(0, running - 1))  # minus the thread reading the file
        if i + 1 < samples:
            time.sleep(interval)
    return min(counts)


def choose_threads(requested: int = 0) -> ThreadChoice:
    avail = available_cores()
    if requested:
        return ThreadChoice(requested, avail, 0, "--threads")
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return ThreadChoice(int(env), avail, 0, "OMP_NUM_THREADS")
    busy = min(busy_cores(), avail - 1)
    return ThreadChoice(max(1, avail - busy), avail, busy, "available cores")


_last: ThreadChoice | None = None


def set_threads(requested: int = 0) -> ThreadChoice:
    """Choose (:func:`choose_threads`) and apply the thread count; remembered for
    :func:`describe_current`."""
    import torch

    global _last
    _last = choose_threads(requested)
    torch.set_num_threads(_last.threads)
    return _last


def describe_current() -> str:
    """One line saying how many threads torch uses and how that was chosen."""
    import torch

    n = torch.get_num_threads()
    if _last is not None and _last.threads == n:
        return _last.describe()
    return f"threads: {n} (torch's setting)"
