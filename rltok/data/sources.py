"""Reading documents from a data source.

A source is a file, a directory (read recursively), a glob, a prepared directory (see
``rltok data prepare``), a built-in name (``stdlib``, ``english``) or ``prose`` (Wikipedia and
books, split by article and author in rltok/data/prose.py, not by ``split_corpus``). Formats by
extension:

* ``.txt .md .rst .py .pod`` (and any explicitly named file of another type): one document per file
* ``.jsonl``: one JSON object per line with a ``text`` field (``data.text_field``)
* ``.json``: a top-level array of such objects (or one object)
* ``.parquet``: the ``text`` column
* any of these with ``.gz``

Documents are bytes: invalid UTF-8 is kept as is. Every problem is reported as one line naming the
file (and line): a missing path, a malformed JSON line, a missing or non-string text field, a
truncated gzip or parquet file.
"""

from __future__ import annotations

import glob as globlib
import gzip
import io
import json
import os
import zlib
from pathlib import Path
from typing import Any, Iterator

from ..schema import DataConfig
from ..errors import RltokError
from .corpus import Corpus, normalize_docs
from .builtin import BUILTINS, load_builtin
from .prepared import open_all
from .prose import NAME as PROSE, is_prose_source

TEXT_EXTS = (".txt", ".md", ".rst", ".py", ".pod", ".text")
JSONL_EXTS = (".jsonl", ".ndjson")
KNOWN_EXTS = TEXT_EXTS + JSONL_EXTS + (".json", ".parquet")


def _base_ext(path: Path) -> tuple[str, bool]:
    name = path.name.lower()
    gz = name.endswith(".gz")
    if gz:
        name = name[:-3]
    return os.path.splitext(name)[1], gz


def _open_bytes(path: Path, gz: bool) -> bytes:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise RltokError(f"{path}: cannot read: {e.strerror or e}") from None
    if not gz:
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise RltokError(f"{path}: not a valid gzip file ({e})") from None


def _text_of(obj, path: Path, where: str, field: str) -> bytes:
    if not isinstance(obj, dict):
        raise RltokError(f"{path}:{where}: expected a JSON object with a {field!r} field, got {type(obj).__name__}")
    if field not in obj:
        raise RltokError(f"{path}:{where}: no {field!r} field (set data.text_field)")
    text = obj[field]
    if not isinstance(text, str):
        raise RltokError(f"{path}:{where}: field {field!r} is {type(text).__name__}, not a string")
    return text.encode("utf-8", errors="surrogatepass")


def json_error(e: BaseException) -> str:
    """Why a JSON text did not parse, in a few words (json.loads also raises ValueError for
    integers of more than 4300 digits, and RecursionError for very deep nesting)."""
    if isinstance(e, json.JSONDecodeError):
        return e.msg
    if isinstance(e, UnicodeDecodeError):
        return "invalid UTF-8"
    if isinstance(e, RecursionError):
        return "nested too deeply"
    return str(e).split(";")[0][:100]


def json_lines(data: bytes, path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) of each non-blank line of a JSON-lines text; a line that does
    not parse is an error naming the file and line."""
    for lineno, line in enumerate(io.BytesIO(data), start=1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except (ValueError, RecursionError) as e:
            raise RltokError(f"{path}:{lineno}: malformed JSON line ({json_error(e)})") from None


def read_jsonl(path: Path, gz: bool, field: str) -> Iterator[bytes]:
    for lineno, obj in json_lines(_open_bytes(path, gz), path):
        yield _text_of(obj, path, str(lineno), field)


def read_json(path: Path, gz: bool, field: str) -> Iterator[bytes]:
    data = _open_bytes(path, gz)
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError) as e:
        where = f"{e.lineno}" if isinstance(e, json.JSONDecodeError) else "1"
        raise RltokError(f"{path}:{where}: malformed JSON ({json_error(e)})") from None
    items = obj if isinstance(obj, list) else [obj]
    for i, item in enumerate(items):
        yield _text_of(item, path, f"item {i}", field)


def read_parquet(path: Path, field: str) -> Iterator[bytes]:
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover
        raise RltokError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from None
    try:
        pf = pq.ParquetFile(path)
        if field not in pf.schema_arrow.names:
            raise RltokError(f"{path}: no {field!r} column (columns: {', '.join(pf.schema_arrow.names)})")
        for batch in pf.iter_batches(columns=[field], batch_size=4096):
            for v in batch.column(0).to_pylist():
                if v is None:
                    continue
                if isinstance(v, bytes):
                    yield v
                elif isinstance(v, str):
                    yield v.encode("utf-8", errors="surrogatepass")
                else:
                    raise RltokError(f"{path}: column {field!r} holds {type(v).__name__}, not text")
    except RltokError:
        raise
    except Exception as e:  # pyarrow raises many types for corrupt files
        raise RltokError(f"{path}: not a readable parquet file ({type(e).__name__}: {e})") from None


def read_file(path: Path, field: str = "text") -> Iterator[bytes]:
    ext, gz = _base_ext(path)
    if ext in JSONL_EXTS:
        yield from read_jsonl(path, gz, field)
    elif ext == ".json":
        yield from read_json(path, gz, field)
    elif ext == ".parquet":
        yield from read_parquet(path, field)
    else:
        yield _open_bytes(path, gz)


def expand_paths(spec: str) -> list[Path]:
    p = Path(spec).expanduser()
    if p.is_file():
        return [p]
    if p.is_dir():
        files = [f for f in sorted(p.rglob("*")) if f.is_file() and _base_ext(f)[0] in KNOWN_EXTS
                 and not any(part.startswith(".") for part in f.relative_to(p).parts)]
        if not files:
            raise RltokError(f"data source {spec!r}: directory has no {'/'.join(KNOWN_EXTS)} files")
        return files
    if any(c in spec for c in "*?["):
        files = [Path(f) for f in sorted(globlib.glob(os.path.expanduser(spec), recursive=True))
                 if Path(f).is_file()]
        if not files:
            raise RltokError(f"data source {spec!r}: the glob matches no files")
        return files

    raise RltokError(f"data source {spec!r}: no such file or directory, and not a built-in corpus "
                     f"({', '.join(BUILTINS + (PROSE,))})")


def read_documents(spec: str, cfg: DataConfig | None = None) -> list[bytes]:
    """All documents of a source (before the split), long ones cut, short ones dropped."""
    cfg = cfg or DataConfig()

    if spec.startswith("hf:"):
        raise RltokError(f"data source {spec!r}: hub datasets are streamed by `rltok data prepare "
                         f"{spec} --out DIR`; then train with --data DIR")
    if spec in BUILTINS:
        docs = load_builtin(spec)
    else:
        docs = [d for f in expand_paths(spec) for d in read_file(f, cfg.text_field)]
    docs = normalize_docs(docs, cfg)
    if not docs:
        raise RltokError(f"data source {spec!r}: no documents (empty, or all shorter than "
                         f"data.min_doc_bytes={cfg.min_doc_bytes})")
    return docs


def load_corpus(spec: str, cfg: DataConfig | None = None) -> Corpus:
    """All documents of a source; for a prepared directory, a memory-mapped view of all of them."""
    if (Path(spec).expanduser() / "manifest.json").is_file():
        return open_all(spec)  # type: ignore[return-value]  # same reading interface
    if is_prose_source(spec):  # the documents of its fixed splits (rltok/data/prose.py)
        from dataclasses import replace

        from .prose import prose_corpus

        return prose_corpus(replace(cfg or DataConfig(), source=spec))
    return Corpus.from_docs(read_documents(spec, cfg), name=spec)
