"""What the built-in corpora share: the cache folder, and reading Debian packages (.deb = ar
archive holding a data tarball)."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Callable

from ..errors import RltokError
from ..locks import held


def cache_dir() -> Path:
    return Path(os.environ.get("RLTOK_CACHE", Path.home() / ".cache" / "rltok"))


def ar_members(blob: bytes):
    """Members of an ``ar`` archive (the .deb container)."""
    if not blob.startswith(b"!<arch>\n"):
        raise RltokError("not a Debian package (bad ar header)")
    pos = 8
    while pos + 60 <= len(blob):
        header = blob[pos:pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        yield name, blob[pos + 60:pos + 60 + size]
        pos += 60 + size + (size & 1)


def write_docs(d: Path, docs: list[bytes]) -> None:
    """Documents as ``d/data.npy`` (the bytes, concatenated) and ``d/offsets.npy``."""
    import numpy as np

    d.mkdir(parents=True, exist_ok=True)
    lens = np.array([len(b) for b in docs], dtype=np.int64)
    np.save(d / "offsets.npy", np.concatenate([[0], np.cumsum(lens)]))
    np.save(d / "data.npy", np.frombuffer(b"".join(docs), dtype=np.uint8))


def read_docs(d: Path, what: str) -> list[bytes]:
    """The documents ``write_docs`` wrote (memory-mapped), or one line saying the cache is damaged."""
    import numpy as np

    try:
        data = np.load(d / "data.npy", mmap_mode="r")
        offsets = np.load(d / "offsets.npy")
        return [bytes(data[offsets[i]:offsets[i + 1]]) for i in range(len(offsets) - 1)]
    except Exception as e:  # numpy raises many types for a damaged file
        raise RltokError(f"{d}: damaged cache of {what} ({type(e).__name__}); "
                         f"remove the folder to fetch it again") from None


def fetch_once(dest: Path, ready: Callable[[Path], bool], build: Callable[[Path], None], what: str) -> Path:
    """``dest`` once ``ready(dest)``, else built there first by ``build(folder)``: into a temporary
    sibling that replaces ``dest`` only when complete. Processes that need it at once (the ranks
    of a torchrun job) wait on a lock while one of them builds."""
    if ready(dest):
        return dest
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(held(dest.parent / f"{dest.name}.lock"))
        except OSError as e:
            raise RltokError(f"{what}: cannot write its cache {dest.parent}: {e.strerror or e}") from None
        if not ready(dest):
            tmp = dest.with_name(dest.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            build(tmp)
            shutil.rmtree(dest, ignore_errors=True)
            os.replace(tmp, dest)
    return dest
