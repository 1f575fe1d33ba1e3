"""What the built-in corpora share: the cache folder, and reading Debian packages (.deb = ar
archive holding a data tarball)."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import RltokError


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
