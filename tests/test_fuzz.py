"""Bad input to every reader and command: property-based tests (hypothesis).

Arbitrary bytes, invalid UTF-8, NUL bytes, empty documents, JSON of the wrong shape or type,
truncated gzip/bz2/parquet files, damaged prepared corpora, arbitrary ``--text`` and ``--set``
values. Each either works (bytes are bytes) or ends with exit status 2 and one line
``error: ...`` naming the file (and line), never a traceback; a 50 MB single-line file neither
hangs nor blows up memory.

Commands run in this process (``rltok.cli.main``) for speed; any exception escaping ``main`` fails
the test. RLTOK_FUZZ_EXAMPLES=N raises the number of examples, RLTOK_FUZZ_RANDOM=1 draws new ones
(the default is hypothesis's derandomized, repeatable run).
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rltok.cli import main
from rltok.schema import apply_overrides, config_keys
from rltok.config import build_config
from rltok.data.sources import read_documents
from rltok.errors import RltokError
from rltok.tasks.formats import TASKS, read_official

EXAMPLES = int(os.environ.get("RLTOK_FUZZ_EXAMPLES", "25"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("RLTOK_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], database=None)
REPO = Path(__file__).resolve().parents[1]


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``rltok ARGV`` in this process; returns (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse
            code = e.code
    return code, out.getvalue(), err.getvalue()


def assert_clean(code: int, err: str, names: list[str] = ()) -> str | None:
    """Exit 0, or exit 2 with exactly one ``error:`` line (naming one of ``names`` if given) and
    no traceback. Returns the error line."""
    assert "Traceback" not in err, err
    if code == 0:
        return None
    lines = [x for x in err.strip().splitlines() if x.strip()]
    errors = [x for x in lines if x.startswith("error: ")]
    assert code == 2 and len(errors) == 1 and lines[-1] == errors[0], (code, err)
    if names:
        assert any(n in errors[0] for n in names), errors[0]
    return errors[0]


# -- strategies ------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


def _mutate(data: bytes, draw) -> bytes:
    """Truncate, cut, or inject invalid UTF-8 / NUL bytes somewhere."""
    how = draw(st.sampled_from(["keep", "truncate", "inject", "inject"]))
    if not data or how == "keep":
        return data
    i = draw(st.integers(0, len(data)))
    if how == "truncate":
        return data[:i]
    junk = draw(st.sampled_from([b"\x00", b"\xff\xfe", b"\xc3", b"\xed\xa0\x80", b"\n", b"\"", b"}", b"\x00" * 5]))
    return data[:i] + junk + data[i:]


@st.composite
def jsonl_bytes(draw, field_names=("text",)) -> bytes:
    """Lines of JSON objects with the expected fields holding values of any type, or any JSON,
    then mutated."""
    lines = []
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.booleans()):
            obj = {k: draw(st.text(max_size=60) | json_values) for k in field_names if draw(st.integers(0, 5))}
            obj.update(draw(st.dictionaries(st.text(max_size=6), json_values, max_size=2)))
        else:
            obj = draw(json_values)
        lines.append(json.dumps(obj) if draw(st.integers(0, 5))
                     else json.dumps(obj).replace(",", "", 1))
    return _mutate("\n".join(lines).encode("utf-8", "surrogatepass"), draw)


@st.composite
def compressed(draw, inner: bytes, kind: str) -> bytes:
    data = gzip.compress(inner) if kind == "gz" else bz2.compress(inner)
    if draw(st.booleans()):
        data = data[:draw(st.integers(0, len(data)))]
    return data


# -- 1. data readers -------------------------------------------------------------------------------

DATA_EXTS = [".txt", ".jsonl", ".json", ".jsonl.gz", ".txt.gz", ".json.gz", ".parquet", ".md"]


def _parquet_bytes(texts: list[str]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.table({"text": texts}), buf)
    return buf.getvalue()


@st.composite
def data_file(draw) -> tuple[str, bytes]:
    ext = draw(st.sampled_from(DATA_EXTS))
    if ext == ".parquet":
        data = _parquet_bytes(draw(st.lists(st.text(max_size=50), max_size=5)))
        if draw(st.booleans()):
            data = _mutate(data, draw)
    elif ext.startswith(".json"):
        if ext.startswith(".jsonl"):
            inner = draw(jsonl_bytes())
        else:
            inner = _mutate(json.dumps(draw(st.lists(st.dictionaries(st.just("text"), json_values, max_size=1),
                                                     max_size=4) | json_values)).encode(), draw)
        data = draw(compressed(inner, "gz")) if ext.endswith(".gz") else inner
    else:
        inner = draw(st.binary(max_size=3000))
        data = draw(compressed(inner, "gz")) if ext.endswith(".gz") else inner
    if draw(st.integers(0, 9)) == 0:
        data = draw(st.binary(max_size=300))  # anything at all, whatever the extension says
    return ext, data


@FUZZ
@given(data_file())
def test_data_readers_take_any_bytes(file):
    ext, data = file
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"corpus{ext}"
        path.write_bytes(data)
        try:
            docs = read_documents(str(path))
        except RltokError as e:
            assert str(path) in str(e) and "\n" not in str(e), str(e)
            return
        assert all(isinstance(x, bytes) and len(x) >= 1 for x in docs)
        if ext in (".txt", ".md") and data:
            assert b"".join(docs) == data  # bytes are bytes: a text file is one document, as is


@FUZZ
@given(data_file())
def test_eval_on_any_data_file(smoke_runs, file):
    """The same files through the command line: ``rltok eval RUN --data FILE``."""
    ext, data = file
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"corpus{ext}"
        path.write_bytes(data)
        code, out, err = run_cli(["eval", str(smoke_runs["rl"]), "--data", str(path), "--split", "all",
                                  "--docs", "2", "--threads", "1"])
        assert_clean(code, err, [str(path)])


# -- 2. eval-file readers ----------------------------------------------------------------------------

TASK_FIELDS = {
    "piqa": ("goal", "sol1", "sol2"),
    "arc_easy": ("id", "question", "answerKey"),
    "lambada": ("text",),
    "hellaswag": ("activity_label", "ctx_a", "ctx_b", "endings", "label", "ind"),
}


@st.composite
def task_folder(draw) -> tuple[str, dict[str, bytes]]:
    """One task's folder with fuzzed files (names as read_official expects them)."""
    task = draw(st.sampled_from(TASKS))
    body = draw(jsonl_bytes(TASK_FIELDS[task]))
    if task == "arc_easy" and draw(st.booleans()):  # a nested question object of fuzzed shape
        q = {"stem": draw(st.text(max_size=20) | json_values),
             "choices": draw(st.lists(st.dictionaries(st.sampled_from(["text", "label"]), json_values, max_size=2)
                                      | json_values, max_size=4))}
        body = _mutate(json.dumps({"question": q, "answerKey": draw(json_values)}).encode(), draw)
    files = {}
    if task == "piqa":
        files["valid.jsonl"] = body
        files["valid-labels.lst"] = _mutate("\n".join(draw(st.lists(st.sampled_from(["0", "1", "2", "", "x"]),
                                                                    max_size=6))).encode(), draw)
    elif task == "lambada":
        files["lambada_test.jsonl"] = body
    elif task == "arc_easy":
        files["ARC-Easy-Test.jsonl"] = body
    else:
        kind = draw(st.sampled_from(["jsonl", "txt", "txt.bz2"]))
        if kind == "jsonl":
            files["hellaswag_val.jsonl"] = body
        else:
            lines = draw(st.lists(st.text(max_size=30) | st.sampled_from(["0", "1", "3", "9"]), max_size=13))
            raw = _mutate("\n".join(lines).encode("utf-8", "surrogatepass"), draw)
            files[f"hellaswag.{kind}"] = draw(compressed(raw, "bz2")) if kind.endswith("bz2") else raw
    return task, files


def _write_task(root: Path, task: str, files: dict[str, bytes]) -> list[str]:
    (root / task).mkdir(parents=True)
    for name, data in files.items():
        (root / task / name).write_bytes(data)
    return [str(root / task / n) for n in files]


@FUZZ
@given(task_folder())
def test_task_readers_take_any_bytes(folder):
    task, files = folder
    with tempfile.TemporaryDirectory() as d:
        names = _write_task(Path(d), task, files)
        try:
            items, _ = read_official(task, Path(d))
        except RltokError as e:
            assert any(n in str(e) for n in names), str(e)
            return
        for it in items:
            assert isinstance(it.context, str) and it.choices and 0 <= it.gold < len(it.choices)
            assert all(isinstance(c, str) for c in it.choices)


@settings(FUZZ, max_examples=max(5, EXAMPLES // 3))
@given(task_folder())
def test_tasks_command_on_any_files(smoke_runs, folder):
    task, files = folder
    with tempfile.TemporaryDirectory() as d:
        names = _write_task(Path(d), task, files)
        code, out, err = run_cli(["tasks", str(smoke_runs["rl"]), "--data-dir", d, "--tasks", task,
                                  "--limit", "2", "--threads", "1"])
        assert_clean(code, err, names)


# -- 3. prepared corpora ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    from conftest import _docstring_texts
    from rltok.data.prepare import PrepareOptions, prepare

    root = tmp_path_factory.mktemp("prepared")
    src = root / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in _docstring_texts()))
    prepare(PrepareOptions(str(src), str(root / "prep"), min_bytes=1, val_docs=4, shard_bytes=4096), progress=False)
    return root / "prep"


@st.composite
def damage(draw, files: list[str]) -> tuple[str, str, int, bytes]:
    name = draw(st.sampled_from(files))
    how = draw(st.sampled_from(["truncate", "flip", "delete", "replace", "json"]))
    return name, how, draw(st.integers(0, 1 << 20)), draw(st.binary(max_size=64))


def _apply_damage(d: Path, name: str, how: str, where: int, junk: bytes, draw_json) -> None:
    f = d / name
    data = f.read_bytes()
    pos = where % (len(data) + 1)
    if how == "truncate":
        f.write_bytes(data[:pos])
    elif how == "flip" and data:
        b = bytearray(data)
        b[pos % len(data)] ^= 0xFF
        f.write_bytes(bytes(b))
    elif how == "delete":
        f.unlink()
    elif how == "replace":
        f.write_bytes(junk)
    elif how == "json" and name == "manifest.json":
        m = json.loads(data)
        path = draw_json["path"]  # a key path into the manifest, set to a fuzzed value
        node = m
        for k in path[:-1]:
            node = node[k] if isinstance(node, dict) and k in node else node
        if isinstance(node, dict):
            node[path[-1]] = draw_json["value"]
        f.write_text(json.dumps(m))


@FUZZ
@given(st.data())
def test_damaged_prepared_corpus(smoke_runs, prepared, data):
    """A prepared corpus with one file truncated, flipped, deleted, replaced or (the manifest)
    holding a value of the wrong type: `data verify` reports it (one line, naming the corpus), and
    evaluating or training on it works (bytes are bytes) or fails the same clean way."""
    files = sorted(str(p.relative_to(prepared)) for p in prepared.rglob("*") if p.is_file())
    name, how, where, junk = data.draw(damage(files))
    manifest = json.loads((prepared / "manifest.json").read_text())
    key_paths = [["format"], ["files"], ["shards"], ["counts"], ["counts", "bytes"]] + \
        [["files", k] for k in manifest["files"]] + [["files", k, "size"] for k in manifest["files"]] + \
        [["shards", 0]]
    draw_json = {"path": data.draw(st.sampled_from(key_paths)), "value": data.draw(json_values)}
    with tempfile.TemporaryDirectory() as d:
        corpus = Path(d) / "prep"
        shutil.copytree(prepared, corpus)
        _apply_damage(corpus, name, how, where, junk, draw_json)
        code, out, err = run_cli(["data", "verify", str(corpus), "--no-progress"])
        msg = assert_clean(code, err, [str(corpus)])
        # data files are covered by the manifest's sha256; an edit of the manifest itself need
        # only be handled cleanly
        changed = any((corpus / f).read_bytes() != (prepared / f).read_bytes() if (corpus / f).exists() else True
                      for f in files if f != "manifest.json")
        assert msg is not None or not changed, "verify accepted a damaged corpus"
        code, out, err = run_cli(["eval", str(smoke_runs["rl"]), "--data", str(corpus), "--split", "train",
                                  "--docs", "2", "--threads", "1"])
        assert_clean(code, err, [str(corpus)])


def test_training_on_a_damaged_prepared_corpus(prepared, tmp_path, capsys):
    """Indexes that point outside the shards stop training before it starts, with one line."""
    import numpy as np

    corpus = tmp_path / "prep"
    shutil.copytree(prepared, corpus)
    starts = np.load(corpus / "doc_start.npy")
    starts[-1] += 10 ** 9
    np.save(corpus / "doc_start.npy", starts)  # same size: the size check cannot see it
    code = main(["train", "--preset", "smoke", "--data", str(corpus), "--out", str(tmp_path / "run"),
                 "--steps", "2", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "documents outside the shards" in assert_clean(code, err, [str(corpus)])
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# -- 4. rltok boundaries --text ----------------------------------------------------------------------

argv_text = st.binary(max_size=300).map(lambda b: b.decode("utf-8", "surrogateescape"))  # as argv arrives


@FUZZ
@given(st.text(max_size=300) | argv_text)
def test_boundaries_on_any_text(smoke_runs, text):
    from rltok.text import to_bytes

    # --text=TEXT: a text that starts with "-" would otherwise read as an option (argparse)
    code, out, err = run_cli(["boundaries", str(smoke_runs["rl"]), f"--text={text}", "--threads", "1"])
    if not text:
        assert code == 2 and assert_clean(code, err) == "error: the text is empty"
        return
    assert code == 0, err
    n = len(to_bytes(text)[:4096])
    assert err.strip().startswith(f"[{n} bytes, "), err  # every byte was read, none dropped or added


def test_boundaries_argv_bytes_subprocess(smoke_runs):
    """Invalid UTF-8 on a real command line: the bytes are kept, the output is printable."""
    r = subprocess.run([sys.executable.encode(), b"-m", b"rltok", b"boundaries", str(smoke_runs["rl"]).encode(),
                        b"--text", b"caf\xc3\xa9 \xff\xfe ok", b"--threads", b"1"],
                       capture_output=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert r.stderr.decode().strip().startswith("[11 bytes, ")
    assert "Traceback" not in r.stderr.decode()


# -- 5. configuration values -------------------------------------------------------------------------

KEYS = config_keys(build_config("rl", "smoke"))
odd_values = st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1e400", "1e30", "1/0", "0/0", "", " ", "x",
                              "true", "9" * 30, "-9" * 20, "0.5", "1.5", "2"]) | st.text(max_size=12)


@FUZZ
@given(st.sampled_from(KEYS), odd_values)
def test_any_config_value_is_accepted_or_rejected_cleanly(key, value):
    try:
        cfg = apply_overrides(build_config("rl", "smoke"), [f"{key}={value}"]).validate()
    except RltokError as e:
        assert "\n" not in str(e)
        return
    # accepted: every number is finite and typed as declared (validate checks it)
    assert cfg.to_json()


@settings(FUZZ, max_examples=max(5, EXAMPLES // 2))
@given(st.sampled_from(KEYS), odd_values)
def test_train_rejects_bad_values_before_any_work(key, value):
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "run"
        try:
            apply_overrides(build_config("rl", "smoke"), [f"{key}={value}"]).validate()
            valid = True
        except RltokError:
            valid = False
        assume(not valid)
        code, _, err = run_cli(["train", "--preset", "smoke", "--set", f"{key}={value}", "--out", str(out)])
        assert_clean(code, err)
        assert code == 2 and not out.exists()


@pytest.mark.parametrize("argv", [
    ["tasks", "RUN", "--limit", "0"], ["tasks", "RUN", "--samples", "-1"], ["tasks", "RUN", "--seed", "-1"],
    ["generate", "RUN", "--max-bytes", "-1"], ["generate", "RUN", "--top-p", "nan"],
    ["generate", "RUN", "--temperature", "-1"], ["generate", "RUN", "--device", "tpu"],
    ["eval", "RUN", "--docs", "0"], ["eval", "RUN", "--seed", str(2 ** 64)],
    ["boundaries", "RUN", "--text", "x", "--max-bytes", "-1"],
    ["compare", "--methods", "rl", "--seeds", "x", "--out", "OUT"],
    ["compare", "--methods", "rl", "--seeds", "-1", "--out", "OUT"],
    ["compare", "--methods", "nonsense", "--out", "OUT"],
    ["bench", "--warmup", "-1"], ["bench", "--peak-seconds", "0"],
    ["train", "--bytes", "nan", "--out", "OUT"], ["train", "--set", "train.lr=1/0", "--out", "OUT"],
    ["data", "prepare", "stdlib", "--out", "OUT", "--min-bytes", "0"],
    ["data", "prepare", "stdlib", "--out", "OUT", "--val-docs", "-5"],
])
def test_out_of_range_options_rejected_before_work(smoke_runs, tmp_path, argv):
    run = str(smoke_runs["rl"])
    out = tmp_path / "out"
    argv = [run if a == "RUN" else str(out) if a == "OUT" else a for a in argv]
    code, stdout, err = run_cli(argv)
    assert code == 2 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") or ": error: " in last  # ours, or argparse's usage error
    assert not out.exists() and not stdout.strip()


# -- 6. a 50 MB single line ----------------------------------------------------------------------------

@pytest.mark.parametrize("ext", [".jsonl", ".txt"])
def test_fifty_megabyte_single_line(smoke_runs, tmp_path, ext):
    """A 50 MB file without a newline: read, cut into documents and evaluated in seconds, within a
    sane amount of memory (the peak RSS of the whole process, torch included)."""
    path = tmp_path / f"big{ext}"
    text = " ".join(map(str, range(7_000_000)))[:50_000_000]  # 50 MB, no two 64 KB pieces alike
    path.write_text(json.dumps({"text": text}) if ext == ".jsonl" else text)
    del text
    cmd = [sys.executable, "-m", "rltok", "eval", str(smoke_runs["rl"]), "--data", str(path), "--docs", "2",
           "--threads", "1", "--json"]
    t = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    try:
        out, err = p.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail("hung on a 50 MB line")
    elapsed = time.monotonic() - t
    import resource

    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    assert p.returncode == 0, err.decode(errors="replace")[-2000:]
    res = json.loads(out.decode().strip().splitlines()[-1])
    assert res["docs"] == 2
    assert elapsed < 120
    assert peak_mb < 2500, f"peak RSS {peak_mb:.0f} MB"
