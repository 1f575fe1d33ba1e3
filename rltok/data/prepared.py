"""Reading a prepared corpus (written by ``rltok data prepare``) without loading it into memory.

Layout of a prepared directory ``DIR``::

    DIR/manifest.json              written last: format, source, filter, split, counts, files (size, sha256)
    DIR/shards/shard-00000.u8 ...  raw document bytes back to back; a document never straddles shards
    DIR/doc_start.npy              int64: global byte offset of each kept document (source order)
    DIR/doc_length.npy             int64: its length in bytes
    DIR/doc_key.npy                uint64: its keyed hash (the split order and the duplicate check)
    DIR/split_train.npy            int64: document numbers of each split; train in source order,
    DIR/split_val.npy              validation and test in key order (exactly the rule of
    DIR/split_test.npy             ``data.corpus.split_corpus``)

The shards are memory-mapped; a :class:`PreparedCorpus` is a view (start, length) over them, so
opening a split costs a few index arrays, and each data-parallel rank touches only the bytes of
the documents its sequences come from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import RltokError
from .corpus import Splits
from ..checkpoint import sha256_file

FORMAT = "rltok-prepared-v1"
MANIFEST = "manifest.json"
SPLITS = ("train", "val", "test")


class ShardedBytes:
    """Read-only uint8 "array" over several memory-mapped shard files, addressed by global
    offset. Supports what the corpus readers use: ``len``, slices inside one shard (a document)
    and integer-array indexing (the stream packer's gathers)."""

    dtype = np.dtype(np.uint8)

    def __init__(self, paths: list[Path], sizes: list[int]):
        self.paths = [Path(p) for p in paths]
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.bounds = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(self.sizes, out=self.bounds[1:])
        self._maps: list[np.ndarray | None] = [None] * len(self.paths)

    def _shard(self, k: int) -> np.ndarray:
        m = self._maps[k]
        if m is None:
            if self.sizes[k] == 0:
                m = np.zeros(0, dtype=np.uint8)
            else:
                m = np.memmap(self.paths[k], dtype=np.uint8, mode="r", shape=(int(self.sizes[k]),))
            self._maps[k] = m
        return m

    def __len__(self) -> int:
        return int(self.bounds[-1])

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                return self[np.arange(start, stop, step, dtype=np.int64)]
            if stop <= start:
                return np.zeros(0, dtype=np.uint8)
            k = int(np.searchsorted(self.bounds, start, side="right") - 1)
            if stop <= self.bounds[k + 1]:  # the usual case: one document, one shard
                return self._shard(k)[start - self.bounds[k]:stop - self.bounds[k]]
            return self[np.arange(start, stop, dtype=np.int64)]
        if isinstance(key, (int, np.integer)):
            i = int(key) + (len(self) if key < 0 else 0)
            k = int(np.searchsorted(self.bounds, i, side="right") - 1)
            return self._shard(k)[i - self.bounds[k]]
        idx = np.asarray(key, dtype=np.int64)
        out = np.empty(idx.shape, dtype=np.uint8)
        if idx.size == 0:
            return out
        which = np.searchsorted(self.bounds, idx, side="right") - 1
        for k in np.unique(which):
            sel = which == k
            out[sel] = self._shard(int(k))[idx[sel] - self.bounds[k]]
        return out


@dataclass
class PreparedCorpus:
    """Documents as (start, length) views into shared storage; the same reading interface as
    :class:`~rltok.data.corpus.Corpus` (``doc``, ``doc_bytes``, ``starts``, ``lengths``)."""

    data: Any  # ShardedBytes or any uint8 array
    starts: np.ndarray  # int64 (n_docs,)
    lengths_: np.ndarray  # int64 (n_docs,)
    name: str = ""

    def __len__(self) -> int:
        return len(self.starts)

    def doc(self, i: int) -> np.ndarray:
        s = int(self.starts[i])
        return self.data[s:s + int(self.lengths_[i])]

    def doc_bytes(self, i: int) -> bytes:
        return bytes(self.doc(i))

    @property
    def lengths(self) -> np.ndarray:
        return self.lengths_

    @property
    def total_bytes(self) -> int:
        return int(self.lengths_.sum())

    def subset(self, index: np.ndarray) -> "PreparedCorpus":
        index = np.asarray(index, dtype=np.int64)
        return PreparedCorpus(self.data, self.starts[index], self.lengths_[index], self.name)


def read_manifest(path: str | Path) -> dict[str, Any]:
    d = Path(path).expanduser()
    man = d / MANIFEST
    try:
        m = json.loads(man.read_text())
    except FileNotFoundError:
        raise RltokError(f"{d}: not a prepared corpus (no {MANIFEST}); create one with "
                         f"`rltok data prepare SOURCE --out {d}`") from None
    except (ValueError, RecursionError, OSError) as e:
        raise RltokError(f"{man}: unreadable manifest ({str(e)[:200]})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT or not isinstance(m.get("files"), dict):
        raise RltokError(f"{man}: not an rltok prepared-corpus manifest (format {FORMAT})")
    _check_manifest(man, m)
    return m


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _safe_name(name) -> bool:
    """A relative path inside the prepared directory."""
    return isinstance(name, str) and bool(name) and not Path(name).is_absolute() and ".." not in Path(name).parts


def _check_manifest(man: Path, m: dict[str, Any]) -> None:
    """The fields the readers use have the right types (a hand-edited or damaged manifest is
    reported here, not as a crash later)."""
    bad = None
    for name, info in m["files"].items():
        if not (_safe_name(name) and isinstance(info, dict) and _is_int(info.get("size"))
                and isinstance(info.get("sha256"), str)):
            bad = f"files[{name!r}]"
            break
    shards = m.get("shards")
    if bad is None and not isinstance(shards, list):
        bad = "shards"
    elif bad is None:
        for i, sh in enumerate(shards):
            if not (isinstance(sh, dict) and _safe_name(sh.get("path")) and _is_int(sh.get("size"))):
                bad = f"shards[{i}]"
                break
    if bad is None and not (isinstance(m.get("counts"), dict) and _is_int(m["counts"].get("bytes"))):
        bad = "counts"
    if bad is not None:
        raise RltokError(f"{man}: malformed manifest entry {bad} (prepare the corpus again)")


def _check_sizes(d: Path, manifest: dict[str, Any]) -> None:
    for name, info in manifest["files"].items():
        f = d / name
        if not f.is_file():
            raise RltokError(f"{d}: prepared corpus is missing {name}")
        if f.stat().st_size != info["size"]:
            raise RltokError(f"{f}: size {f.stat().st_size} differs from the manifest's {info['size']} "
                             f"(truncated or modified; prepare it again)")


def _load_index(d: Path, name: str) -> np.ndarray:
    try:
        a = np.load(d / name, mmap_mode="r")
    except Exception as e:  # a damaged .npy header makes numpy raise many types (ValueError, SyntaxError, ...)
        raise RltokError(f"{d / name}: unreadable index ({type(e).__name__}: {str(e)[:200]})") from None
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise RltokError(f"{d / name}: not a 1-D integer index (shape {a.shape}, dtype {a.dtype})")
    return a


def open_all(path: str | Path) -> PreparedCorpus:
    """Every kept document of a prepared corpus, in source order (all splits together)."""
    d = Path(path).expanduser()
    manifest = read_manifest(d)
    _check_sizes(d, manifest)
    shards = manifest["shards"]
    data = ShardedBytes([d / s["path"] for s in shards], [s["size"] for s in shards])
    starts = np.asarray(_load_index(d, "doc_start.npy"), dtype=np.int64)
    lengths = np.asarray(_load_index(d, "doc_length.npy"), dtype=np.int64)
    # a damaged index must fail here, not as an out-of-range read in the middle of training
    if len(starts) != len(lengths):
        raise RltokError(f"{d}: doc_start.npy and doc_length.npy differ in length ({len(starts)} vs {len(lengths)})")
    if len(starts) and (starts.min() < 0 or lengths.min() < 0 or (starts + lengths).max() > len(data)):
        raise RltokError(f"{d / 'doc_start.npy'}: documents outside the shards ({len(data):,} bytes); "
                         f"prepare the corpus again")
    return PreparedCorpus(data, starts, lengths, name=str(d))


def open_prepared(path: str | Path) -> Splits:
    """Train/validation/test splits of a prepared corpus, memory-mapped (nothing is read until a
    document is)."""
    d = Path(path).expanduser()
    every = open_all(d)
    parts = {}
    for s in SPLITS:
        index = np.asarray(_load_index(d, f"split_{s}.npy"), dtype=np.int64)
        if len(index) and (index.min() < 0 or index.max() >= len(every)):
            raise RltokError(f"{d / f'split_{s}.npy'}: document numbers outside 0..{len(every) - 1}")
        parts[s] = every.subset(index)
    return Splits(**parts)


def verify_prepared(path: str | Path, progress: bool = False) -> dict[str, Any]:
    """Check every file against the manifest (size and sha256). Returns the manifest."""
    d = Path(path).expanduser()
    manifest = read_manifest(d)
    _check_sizes(d, manifest)
    items = sorted(manifest["files"].items())
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=sum(i["size"] for _, i in items), unit="B", unit_scale=True, desc="verify")
    for name, info in items:
        if sha256_file(d / name) != info["sha256"]:
            raise RltokError(f"{d / name}: sha256 differs from the manifest (corrupted)")
        if bar is not None:
            bar.update(info["size"])
    if bar is not None:
        bar.close()
    return manifest
