"""``rltok data prepare``: stream documents into memory-mappable shards, resumably.

Sources: ``hf:NAME[:CONFIG]`` streams a hub dataset through ``datasets``
(``hf:HuggingFaceFW/fineweb:sample-10BT``, ``hf:codeparrot/codeparrot-clean``); anything else is
read with :mod:`rltok.data.sources` (parquet, jsonl, json, txt files, directories, globs, the
built-in corpora).

Per source document: cut into pieces of at most ``max_doc_bytes`` (0: never), drop pieces under
``min_bytes`` (the paper keeps documents of more than 4096 bytes), keep the first ``truncate_bytes``
of each (the paper trains on the first 4096 bytes of each document), drop exact duplicates, append
the rest to the current shard. The split is decided at the end, by the rule of
:func:`rltok.data.corpus.split_corpus` (documents ordered by a keyed hash of their content: the
first ``val_docs`` are validation, the next ``test_docs`` test, the rest train, kept in source
order), so a prepared directory and the same files read directly split identically.

Resumable: every ``commit_docs`` documents (and on Ctrl-C or a source error) the shard and index
files are fsynced and ``.progress/state.json`` records their sizes and the source position,
atomically. A rerun of the same command truncates anything written after that point and continues
from the recorded source position; the result is byte-identical to an uninterrupted run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ..checkpoint import sha256_file, write_json_atomic
from ..signals import StopRequest
from ..errors import RltokError
from .corpus import auto_val_docs
from .prepared import FORMAT, MANIFEST, SPLITS, read_manifest
from ..version import __version__
from .builtin import BUILTINS, load_builtin
from .sources import expand_paths, read_file

PROGRESS = ".progress"
STATE = "state.json"
# text column of well-known hub datasets (anything else: "text", or --text-field)
HUB_TEXT_FIELDS = {"codeparrot/codeparrot-clean": "content", "transformersbook/codeparrot": "content",
                   "codeparrot/codeparrot-clean-train": "content", "codeparrot/codeparrot-clean-valid": "content"}
# dataset builders that read local files and need no network
PACKAGED_BUILDERS = ("json", "parquet", "csv", "text", "arrow")


@dataclass
class PrepareOptions:
    source: str
    out: str
    min_bytes: int = 4096
    max_doc_bytes: int = 0  # cut longer documents into pieces (0: keep whole)
    truncate_bytes: int = 0  # keep only the first N bytes of each kept document (0: all)
    max_bytes_total: int = 0  # stop before the kept bytes would exceed this (0: no limit)
    val_docs: int = -1  # -1: 10% of the documents, at most 256 (as data.val_docs)
    test_docs: int = 0
    split_seed: int = 1234
    text_field: str = ""  # "": the dataset's known text column, else "text"
    hub_split: str = "train"
    data_files: str = ""  # for hub builders that read files (hf:parquet with --data-files)
    shard_bytes: int = 1 << 28
    commit_docs: int = 2000

    def validate(self) -> None:
        if self.min_bytes < 1:
            raise RltokError(f"--min-bytes={self.min_bytes} must be >= 1")
        if self.max_doc_bytes < 0 or self.max_bytes_total < 0 or self.truncate_bytes < 0:
            raise RltokError("--max-doc-bytes, --truncate-bytes and --max-bytes-total must be >= 0")
        if self.max_doc_bytes and self.max_doc_bytes < self.min_bytes:
            raise RltokError(f"--max-doc-bytes={self.max_doc_bytes} is below --min-bytes={self.min_bytes}: "
                             f"every piece would be dropped")
        if self.val_docs < -1 or self.test_docs < 0:
            raise RltokError("--val-docs and --test-docs must be >= 0")
        if self.shard_bytes < 1 or self.commit_docs < 1:
            raise RltokError("--shard-bytes and the commit interval must be >= 1")

    @property
    def field(self) -> str:
        if self.text_field:
            return self.text_field
        name = parse_hub(self.source)[0] if self.source.startswith("hf:") else ""
        return HUB_TEXT_FIELDS.get(name, "text")

    def fingerprint(self) -> dict[str, Any]:
        """What must not change between an interrupted run and its resumption."""
        d = asdict(self)
        d.pop("out")
        d.pop("commit_docs")
        d["text_field"] = self.field
        return d


@dataclass
class PrepareResult:
    out: Path
    manifest: dict[str, Any]
    resumed: bool = False
    already_done: bool = False
    interrupted: bool = False


# -- sources --------------------------------------------------------------------------------------

def parse_hub(spec: str) -> tuple[str, str | None]:
    """'hf:NAME[:CONFIG]' -> (NAME, CONFIG)."""
    rest = spec[3:]
    name, _, config = rest.partition(":")
    if not name:
        raise RltokError(f"data source {spec!r}: expected hf:NAME or hf:NAME:CONFIG "
                         f"(e.g. hf:HuggingFaceFW/fineweb:sample-10BT)")
    return name, (config or None)


def _no_network(name: str, why: str) -> RltokError:
    return RltokError(f"no network: cannot reach the Hugging Face hub for {name!r} ({why}); pass local "
                      f"files instead (rltok data prepare PATH/TO/*.parquet|*.jsonl --out DIR)")


def _hub_reachable(timeout: float = 5.0) -> str | None:
    """None if the hub's host resolves; else the reason. Skipped behind a proxy (the proxy
    resolves names), where ``datasets`` reports the failure itself."""
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false") or \
            os.environ.get("HF_DATASETS_OFFLINE", "0") not in ("0", "", "false"):
        return "HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set"
    from urllib.parse import urlparse

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    host = urlparse(endpoint).hostname or endpoint
    result: list[str | None] = []

    def probe() -> None:
        try:
            socket.getaddrinfo(host, 443)
            result.append(None)
        except OSError as e:
            result.append(f"{host}: {e.strerror or e}")

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout)
    return result[0] if result else f"{host}: name lookup timed out after {timeout:.0f}s"


def iter_hub(spec: str, field: str, split: str = "train", data_files: str = "",
             skip: int = 0) -> Iterator[tuple[int, bytes]]:
    """(document number, text) from a streamed hub dataset, starting after ``skip`` documents."""
    name, config = parse_hub(spec)
    try:
        import datasets
    except ImportError:
        raise RltokError(f"data source {spec!r}: hub datasets need the `datasets` package "
                         f"(pip install 'rltok[hub]')") from None
    local_builder = name in PACKAGED_BUILDERS and bool(data_files)
    if not local_builder:
        why = _hub_reachable()
        if why:
            raise _no_network(name, why)
    kw: dict[str, Any] = {"split": split, "streaming": True}
    if data_files:
        kw["data_files"] = data_files
    try:
        ds = datasets.load_dataset(name, config, **kw)
        if skip:
            ds = ds.skip(skip)
        it = iter(ds)
    except (ConnectionError, TimeoutError) as e:
        raise _no_network(name, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}") from None
    except Exception as e:  # datasets raises many types for a wrong name/config/split
        raise RltokError(f"data source {spec!r}: cannot open the dataset ({type(e).__name__}: "
                         f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None
    n = skip
    while True:
        try:
            row = next(it)
        except StopIteration:
            return
        except (ConnectionError, TimeoutError, OSError) as e:
            raise RltokError(f"data source {spec!r}: the stream failed after {n} documents "
                             f"({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}); "
                             f"rerun the same command to resume") from None
        if field not in row:
            raise RltokError(f"data source {spec!r}: row {n} has no {field!r} field (fields: "
                             f"{', '.join(row)}); pass --text-field")
        text = row[field]
        if text is None:
            n += 1
            continue
        if not isinstance(text, (str, bytes)):
            raise RltokError(f"data source {spec!r}: row {n} field {field!r} is {type(text).__name__}, not text")
        yield n, text if isinstance(text, bytes) else text.encode("utf-8", errors="surrogatepass")
        n += 1


def local_files(spec: str) -> list[Path] | None:
    """The files of a local source, or None for a built-in corpus."""
    if spec in BUILTINS:
        return None
    from .prose import is_prose_source

    if is_prose_source(spec):  # a hash split by document would put pieces of one book in two splits
        raise RltokError(f"data source {spec!r}: the prose corpus is not prepared; train with --data {spec} "
                         f"(it is split by article and author, and cached, when read)")
    return expand_paths(spec)


def iter_local(spec: str, field: str, skip: int = 0) -> Iterator[tuple[int, bytes]]:
    """(document number, bytes) over all files in order, starting after ``skip`` documents.
    Whole files before the resume point are skipped by their recorded document counts."""
    files = local_files(spec)
    if files is None:
        for n, d in enumerate(load_builtin(spec)):
            if n >= skip:
                yield n, d
        return
    n = 0
    for f in files:
        for d in read_file(f, field):
            if n >= skip:
                yield n, d
            n += 1


def describe_source(opts: PrepareOptions) -> dict[str, Any]:
    if opts.source.startswith("hf:"):
        name, config = parse_hub(opts.source)
        try:
            import datasets

            version = datasets.__version__
        except ImportError:  # pragma: no cover
            version = None
        return {"kind": "hub", "spec": opts.source, "name": name, "config": config,
                "split": opts.hub_split, "data_files": opts.data_files or None,
                "text_field": opts.field, "datasets_version": version}
    files = local_files(opts.source)
    if files is None:
        return {"kind": "builtin", "spec": opts.source, "name": opts.source}
    return {"kind": "files", "spec": opts.source, "text_field": opts.field,
            "files": [{"path": str(f.resolve()), "size": f.stat().st_size} for f in files]}


# -- writing --------------------------------------------------------------------------------------

def doc_key(d: bytes, split_seed: int) -> int:
    """The keyed hash that orders documents for the split (as ``split_corpus``) and finds exact
    duplicates (64 bits: a false duplicate among 10^7 documents has probability ~3e-6)."""
    key = split_seed.to_bytes(8, "little", signed=True)
    return int.from_bytes(hashlib.blake2b(d, key=key, digest_size=8).digest(), "big")


def _pieces(d: bytes, max_doc_bytes: int) -> list[bytes]:
    if max_doc_bytes and len(d) > max_doc_bytes:
        return [d[i:i + max_doc_bytes] for i in range(0, len(d), max_doc_bytes)]
    return [d]


def _fsync(f) -> None:
    f.flush()
    os.fsync(f.fileno())


def _truncate(path: Path, size: int) -> None:
    with open(path, "r+b" if path.exists() else "wb") as f:
        f.truncate(size)


class _Writer:
    """Append-only shard and index files plus the committed state that makes them resumable."""

    def __init__(self, out: Path, opts: PrepareOptions, state: dict[str, Any]):
        self.out, self.opts, self.state = out, opts, state
        self.prog = out / PROGRESS
        (out / "shards").mkdir(parents=True, exist_ok=True)
        self.prog.mkdir(parents=True, exist_ok=True)
        self.index_paths = {k: self.prog / f"{k}.bin" for k in ("start", "length", "key")}
        shards = state["shards"]
        if not shards:
            shards.append({"path": "shards/shard-00000.u8", "size": 0, "sha256": None})
        # drop anything written after the last commit
        for p in sorted((out / "shards").glob("shard-*.u8")):
            if str(p.relative_to(out)) not in {s["path"] for s in shards}:
                p.unlink()
        _truncate(out / shards[-1]["path"], shards[-1]["size"])
        for p in self.index_paths.values():
            _truncate(p, 8 * state["docs_kept"])
        self.keys = np.fromfile(self.index_paths["key"], dtype=np.uint64) if state["docs_kept"] else \
            np.zeros(0, np.uint64)
        self.seen = set(self.keys.tolist())
        self.shard_file = open(out / shards[-1]["path"], "ab")
        self.index_files = {k: open(p, "ab") for k, p in self.index_paths.items()}
        self.total = int(sum(s["size"] for s in shards))  # global offset of the next byte

    @property
    def current(self) -> dict[str, Any]:
        return self.state["shards"][-1]

    def _close_shard(self) -> None:
        _fsync(self.shard_file)
        self.shard_file.close()
        self.current["sha256"] = sha256_file(self.out / self.current["path"])
        k = len(self.state["shards"])
        self.state["shards"].append({"path": f"shards/shard-{k:05d}.u8", "size": 0, "sha256": None})
        self.shard_file = open(self.out / self.current["path"], "ab")

    def add(self, d: bytes, key: int) -> None:
        if self.current["size"] and self.current["size"] + len(d) > self.opts.shard_bytes:
            self._close_shard()
        self.shard_file.write(d)
        self.index_files["start"].write(np.int64(self.total).tobytes())
        self.index_files["length"].write(np.int64(len(d)).tobytes())
        self.index_files["key"].write(np.uint64(key).tobytes())
        self.current["size"] += len(d)
        self.total += len(d)
        self.state["docs_kept"] += 1
        self.state["bytes_kept"] += len(d)
        self.seen.add(key)

    def commit(self) -> None:
        """Make everything written so far durable, then record it (in that order)."""
        _fsync(self.shard_file)
        for f in self.index_files.values():
            _fsync(f)
        write_json_atomic(self.prog / STATE, self.state)

    def close(self) -> None:
        self.shard_file.close()
        for f in self.index_files.values():
            f.close()


def _new_state(opts: PrepareOptions) -> dict[str, Any]:
    return {"format": FORMAT, "options": opts.fingerprint(), "source_pos": 0, "docs_read": 0,
            "docs_kept": 0, "bytes_kept": 0, "pieces_short": 0, "pieces_duplicate": 0,
            "pieces_cut": 0, "stopped_at_limit": False, "source_done": False, "shards": [],
            "started": time.strftime("%Y-%m-%dT%H:%M:%S")}


def _diff(a: dict[str, Any], b: dict[str, Any]) -> str:
    keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return ", ".join(f"{k}: {a.get(k)!r} then, {b.get(k)!r} now" for k in keys)


def _open_state(out: Path, opts: PrepareOptions) -> tuple[dict[str, Any], bool]:
    """The committed state to continue from (fresh or resumed)."""
    sp = out / PROGRESS / STATE
    if sp.is_file():
        try:
            state = json.loads(sp.read_text())
        except (json.JSONDecodeError, OSError) as e:
            raise RltokError(f"{sp}: unreadable preparation state ({e}); remove {out} and start again") from None
        if state.get("options") != opts.fingerprint():
            raise RltokError(f"{out} holds an interrupted preparation with other options "
                             f"({_diff(state.get('options') or {}, opts.fingerprint())}); rerun it with "
                             f"the same options to resume, or choose another --out")
        return state, True
    if out.exists() and any(out.iterdir()):
        raise RltokError(f"{out} exists and is not an interrupted preparation; choose an empty or new --out")
    return _new_state(opts), False


def _StopFlag() -> StopRequest:
    """First Ctrl-C / SIGTERM: finish the current document, commit, stop (resumable)."""
    return StopRequest()


def prepare(opts: PrepareOptions, progress: bool = True, stop_after_docs: int | None = None) -> PrepareResult:
    """Prepare (or resume preparing) ``opts.source`` into ``opts.out``.

    ``stop_after_docs`` stops like a Ctrl-C after that many source documents in this call (for
    tests of resumption)."""
    opts.validate()
    out = Path(opts.out).expanduser()
    if (out / MANIFEST).is_file():
        m = read_manifest(out)
        if m.get("options") != opts.fingerprint():
            raise RltokError(f"{out} already holds a prepared corpus made with other options "
                             f"({_diff(m.get('options') or {}, opts.fingerprint())}); choose another --out")
        return PrepareResult(out=out, manifest=m, already_done=True)
    if opts.source.startswith("hf:"):
        parse_hub(opts.source)
    else:
        local_files(opts.source)  # a clear error for a missing path before anything is created
    source_info = describe_source(opts)
    state, resumed = _open_state(out, opts)
    if resumed and source_info["kind"] == "files":
        before = state.get("source_files")
        if before is not None and before != source_info["files"]:
            raise RltokError(f"the files of {opts.source!r} changed since the interrupted preparation in "
                             f"{out}; remove {out} and start again")
    state["source_files"] = source_info.get("files")
    out.mkdir(parents=True, exist_ok=True)

    if not state["source_done"]:
        interrupted = _stream(out, opts, state, progress, stop_after_docs, resumed)
        if interrupted:
            return PrepareResult(out=out, manifest={}, resumed=resumed, interrupted=True)
    manifest = _finalize(out, opts, state, source_info)
    return PrepareResult(out=out, manifest=manifest, resumed=resumed)


def _stream(out: Path, opts: PrepareOptions, state: dict[str, Any], progress: bool,
            stop_after_docs: int | None, resumed: bool) -> bool:
    """Append documents until the source or the byte limit ends. True if stopped early."""
    w = _Writer(out, opts, state)
    field_name = opts.field
    if opts.source.startswith("hf:"):
        docs = iter_hub(opts.source, field_name, opts.hub_split, opts.data_files, skip=state["source_pos"])
    else:
        docs = iter_local(opts.source, field_name, skip=state["source_pos"])
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=opts.max_bytes_total or None, initial=state["bytes_kept"], unit="B",
                   unit_scale=True, desc=f"prepare {opts.source}", dynamic_ncols=True, file=sys.stderr)
    if resumed:
        print(f"rltok: resuming {out} after {state['source_pos']:,} source documents "
              f"({state['bytes_kept']:,} bytes kept)", file=sys.stderr)
    since_commit, read_here = 0, 0
    stopped = False
    try:
        with _StopFlag() as stop:
            for n, d in docs:
                limit_hit = False
                for piece in _pieces(d, opts.max_doc_bytes):
                    if len(piece) < opts.min_bytes:
                        state["pieces_short"] += 1
                        continue
                    if opts.truncate_bytes:  # the filter saw the whole document (the paper's rule)
                        piece = piece[:opts.truncate_bytes]
                    key = doc_key(piece, opts.split_seed)
                    if key in w.seen:
                        state["pieces_duplicate"] += 1
                        continue
                    if opts.max_bytes_total and state["bytes_kept"] + len(piece) > opts.max_bytes_total:
                        limit_hit = True
                        break
                    w.add(piece, key)
                    if bar is not None:
                        bar.update(len(piece))
                if limit_hit:  # the document that would cross the limit is not taken
                    state["stopped_at_limit"] = True
                    break
                state["pieces_cut"] += len(_pieces(d, opts.max_doc_bytes)) - 1
                state["source_pos"] = n + 1
                state["docs_read"] += 1
                since_commit += 1
                read_here += 1
                if since_commit >= opts.commit_docs:
                    w.commit()
                    since_commit = 0
                if stop.signum is not None or (stop_after_docs is not None and read_here >= stop_after_docs):
                    stopped = True
                    break
        if not stopped:
            state["source_done"] = True
        w.commit()
    except RltokError:
        w.commit()  # what was read so far stays; a rerun resumes after it
        raise
    finally:
        w.close()
        if bar is not None:
            bar.close()
    if stopped:
        print(f"rltok: stopped after {state['source_pos']:,} source documents; rerun the same command "
              f"to resume", file=sys.stderr)
    return stopped


def _finalize(out: Path, opts: PrepareOptions, state: dict[str, Any], source_info: dict[str, Any]) -> dict[str, Any]:
    prog = out / PROGRESS
    n = state["docs_kept"]
    keys = np.fromfile(prog / "key.bin", dtype=np.uint64)
    assert len(keys) == n, (len(keys), n)
    n_val = auto_val_docs(n) if opts.val_docs < 0 else opts.val_docs
    n_test = opts.test_docs
    if n < n_val + n_test + 1:
        raise RltokError(
            f"data source {opts.source!r} gave {n} distinct documents of >= {opts.min_bytes} bytes: too "
            f"few for {n_val} validation + {n_test} test documents and a training set "
            f"(lower --val-docs/--test-docs or --min-bytes); rerun with other options and another --out")
    # the split rule of split_corpus: ascending keyed hash -> val, test; the rest train in source order
    order = np.argsort(keys, kind="stable")
    splits = {"val": order[:n_val].astype(np.int64), "test": order[n_val:n_val + n_test].astype(np.int64),
              "train": np.sort(order[n_val + n_test:]).astype(np.int64)}
    lengths = np.fromfile(prog / "length.bin", dtype=np.int64)
    arrays = {"doc_start.npy": np.fromfile(prog / "start.bin", dtype=np.int64),
              "doc_length.npy": lengths, "doc_key.npy": keys,
              **{f"split_{s}.npy": splits[s] for s in SPLITS}}
    for name, arr in arrays.items():
        tmp = out / f".{name}.tmp"
        with open(tmp, "wb") as f:
            np.save(f, arr)
            _fsync(f)
        os.replace(tmp, out / name)
    shards = state["shards"]
    if shards and shards[-1]["size"] == 0 and len(shards) > 1:  # an empty last shard is dropped
        (out / shards[-1]["path"]).unlink(missing_ok=True)
        shards = shards[:-1]
    for s in shards:
        if s["sha256"] is None:
            s["sha256"] = sha256_file(out / s["path"])
    files = {s["path"]: {"size": s["size"], "sha256": s["sha256"]} for s in shards}
    for name in arrays:
        files[name] = {"size": (out / name).stat().st_size, "sha256": sha256_file(out / name)}

    manifest = {
        "format": FORMAT,
        "rltok_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "source": source_info,
        "options": opts.fingerprint(),
        "filter": {"min_bytes": opts.min_bytes, "rule": "keep documents (pieces) of >= min_bytes bytes",
                   "max_doc_bytes": opts.max_doc_bytes or None, "truncate_bytes": opts.truncate_bytes or None,
                   "deduplicated": "exact (64-bit keyed hash of the stored bytes)"},
        "limit": {"max_bytes_total": opts.max_bytes_total or None, "reached": state["stopped_at_limit"]},
        "split": {"rule": "keyed blake2b-64 of the content, ascending: val, then test, the rest train "
                          "(in source order); as rltok.data.corpus.split_corpus",
                  "seed": opts.split_seed, "val_docs": n_val, "test_docs": n_test},
        "counts": {
            "source_documents_read": state["docs_read"], "documents": n, "bytes": state["bytes_kept"],
            "dropped_short": state["pieces_short"], "dropped_duplicate": state["pieces_duplicate"],
            "extra_pieces_from_cutting": state["pieces_cut"],
            **{f"{s}_documents": int(len(splits[s])) for s in SPLITS},
            **{f"{s}_bytes": int(lengths[splits[s]].sum()) if len(splits[s]) else 0 for s in SPLITS},
        },
        "shards": [{"path": s["path"], "size": s["size"]} for s in shards],
        "files": files,
    }
    write_json_atomic(out / MANIFEST, manifest)
    shutil.rmtree(prog, ignore_errors=True)
    return manifest
