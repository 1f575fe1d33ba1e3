"""Inter-process file locks for caches that many processes may need at once (the ranks of a torchrun
job, `compare` or study cells side by side): one builds, the others wait, then read what it built.
The locking itself is the ``filelock`` library's (a dependency of huggingface_hub): ``flock`` where the
file system has it, so a lock is released by the kernel when its holder dies, even by SIGKILL."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

from filelock import FileLock, Timeout


@contextlib.contextmanager
def held(lock: str | Path, wait: bool = True) -> Iterator[bool]:
    """Hold the lock file ``lock`` for the ``with`` block; yields True. With ``wait=False`` yields
    False at once, without holding anything, when another process holds it."""
    lock = Path(lock)
    lock.parent.mkdir(parents=True, exist_ok=True)
    fl = FileLock(lock, timeout=-1 if wait else 0)
    try:
        fl.acquire()
    except Timeout:
        yield False
        return
    try:
        yield True
    finally:
        fl.release()
