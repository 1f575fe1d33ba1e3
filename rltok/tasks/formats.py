"""Task items and the prompts lm-evaluation-harness builds for them (0-shot).

Every reader yields :class:`TaskItem` ``{task, id, context, choices, gold}`` where ``context`` is
the prompt and each choice is the full continuation, target delimiter included, exactly the
``(context, continuation)`` pairs lm-eval 0.4 sends to ``LM.loglikelihood``:

==========  ========================================================  =============================
task        context                                                   continuation(s)
==========  ========================================================  =============================
piqa        ``"Question: {goal}\\nAnswer:"``                          ``" " + sol1``, ``" " + sol2``
arc_easy    ``"Question: {question}\\nAnswer:"``                      ``" " + choice text`` (3-5)
hellaswag   ``preprocess(activity_label + ": " + ctx_a + " " +         ``" " + preprocess(ending)`` (4)
            ctx_b.capitalize())``
lambada     ``" ".join(text.split(" ")[:-1])``                        ``" " + text.split(" ")[-1]``
==========  ========================================================  =============================

(lm-eval's ``piqa.yaml``, ``arc_easy.yaml``, ``hellaswag.yaml`` + ``hellaswag/utils.py`` and
``lambada_openai.yaml``; ``preprocess`` strips, turns ``" [title]"`` into ``". "``, removes every
``[...]`` tag and collapses double spaces.) ``gold`` indexes ``choices``; LAMBADA has one choice.

Readers for the official files (the layout of ``--data-dir``):

* ``piqa/valid.jsonl`` + ``piqa/valid-labels.lst`` (ybisk.github.io release)
* ``arc_easy/*.jsonl`` (AI2 release: ``{"id", "question": {"stem", "choices": [{"text", "label"}]},
  "answerKey"}``; the Test file if present, else Dev, else all files)
* ``lambada/lambada_test.jsonl`` (OpenAI's copy, ``{"text"}``; what lm-eval's lambada_openai uses)
* ``hellaswag/hellaswag_val.jsonl`` (official) or ``hellaswag/*.txt[.bz2]``, the derived 6-line
  text format (``activity_label: ctx``, gold label, 4 endings) that llama.cpp uses; its text was
  cleaned by a WikiHow cleanup close to, not identical with, lm-eval's ``preprocess`` (which we
  apply on top), so a few items differ from lm-eval's by a space or a bracket tag.
* a normalized ``*.jsonl`` of TaskItems (what ``rltok data fetch-evals`` stores).

Every malformed input raises :class:`RltokError` naming the file and line.
"""

from __future__ import annotations

import bz2
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from ..errors import RltokError

TASKS = ("piqa", "hellaswag", "arc_easy", "lambada")
ALIASES = {"lambada_openai": "lambada", "arc-easy": "arc_easy", "arc": "arc_easy"}


@dataclass
class TaskItem:
    task: str
    id: str
    context: str
    choices: list[str]  # continuations, each with its leading delimiter (" ")
    gold: int

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def target(self) -> str:
        return self.choices[self.gold]


def canonical_task(name: str) -> str:
    n = name.strip().lower()
    n = ALIASES.get(n, n)
    if n not in TASKS:
        raise RltokError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
    return n


# -- lm-eval prompt formats ---------------------------------------------------------------------

def hellaswag_preprocess(text: str) -> str:
    """lm-eval's ``hellaswag/utils.py::preprocess``."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    text = text.replace("  ", " ")
    return text


def piqa_item(goal: str, sols: list[str], label: int, id: str) -> TaskItem:
    return TaskItem("piqa", id, f"Question: {goal}\nAnswer:", [" " + s for s in sols], label)


def arc_item(question: str, choices: list[str], gold: int, id: str) -> TaskItem:
    return TaskItem("arc_easy", id, f"Question: {question}\nAnswer:", [" " + c for c in choices], gold)


def hellaswag_item(activity_label: str, ctx_a: str, ctx_b: str, endings: list[str], label: int,
                   id: str) -> TaskItem:
    ctx = ctx_a + " " + ctx_b.capitalize()
    return TaskItem("hellaswag", id, hellaswag_preprocess(activity_label + ": " + ctx),
                    [" " + hellaswag_preprocess(e) for e in endings], label)


def lambada_item(text: str, id: str) -> TaskItem:
    words = text.split(" ")
    return TaskItem("lambada", id, " ".join(words[:-1]), [" " + words[-1]], 0)


# -- readers -----------------------------------------------------------------------------------

def _read_raw(path: Path) -> bytes:
    """The bytes of a file, bz2-decompressed if it ends in .bz2."""
    try:
        raw = path.read_bytes()
        return bz2.decompress(raw) if path.suffix == ".bz2" else raw
    except OSError as e:
        if e.strerror:
            raise RltokError(f"{path}: cannot read: {e.strerror}") from None
        raise RltokError(f"{path}: not a valid bz2 file ({e})") from None
    except (ValueError, EOFError) as e:  # a truncated bz2 stream
        raise RltokError(f"{path}: not a valid bz2 file ({e})") from None


def _decode_lines(raw: bytes, path: Path) -> list[str]:
    try:
        return raw.decode("utf-8").split("\n")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise RltokError(f"{path}:{line}: invalid UTF-8") from None


def _json_lines(path: Path) -> Iterator[tuple[int, dict]]:
    from ..data.sources import json_lines

    for lineno, obj in json_lines(_read_raw(path), path):
        if not isinstance(obj, dict):
            raise RltokError(f"{path}:{lineno}: expected a JSON object")
        yield lineno, obj


def _field(obj: dict, key: str, path: Path, lineno: int, typ=str):
    if not isinstance(obj, dict):
        raise RltokError(f"{path}:{lineno}: expected a JSON object with a {key!r} field, got {type(obj).__name__}")
    if key not in obj:
        raise RltokError(f"{path}:{lineno}: no {key!r} field")
    v = obj[key]
    if typ is int and isinstance(v, str) and v.strip().lstrip("-").isdigit() and len(v) < 20:
        v = int(v)
    if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
        raise RltokError(f"{path}:{lineno}: field {key!r} is {type(v).__name__}, expected {typ.__name__}")
    return v


def _strings(obj: dict, key: str, path: Path, lineno: int) -> list[str]:
    """A non-empty list of strings."""
    v = _field(obj, key, path, lineno, list)
    if not v or not all(isinstance(x, str) for x in v):
        raise RltokError(f"{path}:{lineno}: {key!r} must be a non-empty list of strings")
    return v


def read_piqa(jsonl: Path, labels: Path) -> list[TaskItem]:
    labs = [x.strip() for x in _decode_lines(_read_raw(labels), labels)]
    while labs and not labs[-1]:
        labs.pop()
    items = []
    for n, (lineno, obj) in enumerate(_json_lines(jsonl)):
        if n >= len(labs):
            raise RltokError(f"{labels}: has {len(labs)} labels but {jsonl} has more examples (line {lineno})")
        if labs[n] not in ("0", "1"):
            raise RltokError(f"{labels}:{n + 1}: label {labs[n]!r} is not 0 or 1")
        sols = [_field(obj, "sol1", jsonl, lineno), _field(obj, "sol2", jsonl, lineno)]
        items.append(piqa_item(_field(obj, "goal", jsonl, lineno), sols, int(labs[n]), str(n)))
    if len(items) != len(labs):
        raise RltokError(f"{labels}: has {len(labs)} labels but {jsonl} has {len(items)} examples")
    return items


def read_arc(path: Path, task: str = "arc_easy") -> list[TaskItem]:
    items = []
    for lineno, obj in _json_lines(path):
        q = _field(obj, "question", path, lineno, dict)
        stem = _field(q, "stem", path, lineno)
        choices = _field(q, "choices", path, lineno, list)
        texts = [_field(c, "text", path, lineno) for c in choices]
        labels = [str(_field(c, "label", path, lineno)) for c in choices]
        key = str(_field(obj, "answerKey", path, lineno))
        if key not in labels:
            raise RltokError(f"{path}:{lineno}: answerKey {key!r} is not one of the labels {labels}")
        it = arc_item(stem, texts, labels.index(key), str(obj.get("id", lineno)))
        it.task = task
        items.append(it)
    return items


def read_lambada(path: Path) -> list[TaskItem]:
    items = []
    for n, (lineno, obj) in enumerate(_json_lines(path)):
        text = _field(obj, "text", path, lineno)
        if " " not in text.strip():
            raise RltokError(f"{path}:{lineno}: a LAMBADA passage needs at least two words")
        items.append(lambada_item(text, str(n)))
    return items


def read_hellaswag_jsonl(path: Path) -> list[TaskItem]:
    items = []
    for n, (lineno, obj) in enumerate(_json_lines(path)):
        endings = _strings(obj, "endings", path, lineno)
        label = _field(obj, "label", path, lineno, int)
        if not 0 <= label < len(endings):
            raise RltokError(f"{path}:{lineno}: label {label} out of range for {len(endings)} endings")
        items.append(hellaswag_item(_field(obj, "activity_label", path, lineno),
                                    _field(obj, "ctx_a", path, lineno), _field(obj, "ctx_b", path, lineno),
                                    endings, label, str(obj.get("ind", n))))
    return items


def read_hellaswag_text(path: Path) -> list[TaskItem]:
    """The derived 6-line format: ``activity_label: ctx``, gold label, 4 endings."""
    lines = _decode_lines(_read_raw(path), path)
    while lines and not lines[-1].strip():
        lines.pop()
    if len(lines) % 6:
        raise RltokError(f"{path}: {len(lines)} lines is not a multiple of 6 (the 6-line HellaSwag format)")
    items = []
    for k in range(0, len(lines), 6):
        lab = lines[k + 1].strip()
        if lab not in ("0", "1", "2", "3"):
            raise RltokError(f"{path}:{k + 2}: gold label {lab!r} is not 0-3")
        items.append(TaskItem("hellaswag", str(k // 6), hellaswag_preprocess(lines[k]),
                              [" " + hellaswag_preprocess(e) for e in lines[k + 2:k + 6]], int(lab)))
    return items


def read_normalized(path: Path) -> list[TaskItem]:
    items = []
    for lineno, obj in _json_lines(path):
        choices = _strings(obj, "choices", path, lineno)
        gold = _field(obj, "gold", path, lineno, int)
        if not 0 <= gold < len(choices):
            raise RltokError(f"{path}:{lineno}: gold {gold} out of range for {len(choices)} choices")
        try:
            task = canonical_task(_field(obj, "task", path, lineno))
        except RltokError as e:
            raise RltokError(f"{path}:{lineno}: {e}") from None
        items.append(TaskItem(task, str(obj.get("id", lineno)), _field(obj, "context", path, lineno), choices, gold))
    return items


def write_normalized(items: list[TaskItem], path: Path) -> None:
    from ..checkpoint import write_bytes_atomic

    body = "".join(json.dumps(it.to_dict(), ensure_ascii=False) + "\n" for it in items)
    write_bytes_atomic(path, body.encode("utf-8"))


def read_official(task: str, folder: Path) -> tuple[list[TaskItem], str]:
    """Items of ``task`` from a folder laid out like ``../shared/data/<task>/``; also returns the
    file(s) read."""
    task = canonical_task(task)
    d = Path(folder) / task
    if not d.is_dir():
        raise RltokError(f"{d}: no such directory (--data-dir must hold {', '.join(TASKS)} folders)")
    if task == "piqa":
        j, lab = d / "valid.jsonl", d / "valid-labels.lst"
        for p in (j, lab):
            if not p.is_file():
                raise RltokError(f"{p}: missing (PIQA needs valid.jsonl and valid-labels.lst)")
        return read_piqa(j, lab), str(j)
    if task == "lambada":
        p = d / "lambada_test.jsonl"
        if not p.is_file():
            raise RltokError(f"{p}: missing")
        return read_lambada(p), str(p)
    if task == "arc_easy":
        files = sorted(d.glob("*.jsonl"))
        pick = ([f for f in files if "test" in f.name.lower()] or [f for f in files if "dev" in f.name.lower()]
                or files)
        if not pick:
            raise RltokError(f"{d}: no ARC *.jsonl file")
        return [it for f in pick for it in read_arc(f)], ", ".join(map(str, pick))
    # hellaswag: the official jsonl first, else the derived text format
    official = d / "hellaswag_val.jsonl"
    if official.is_file():
        return read_hellaswag_jsonl(official), str(official)
    texts = sorted(list(d.glob("*.txt.bz2")) + list(d.glob("*.txt")))
    if texts:
        return read_hellaswag_text(texts[0]), str(texts[0])
    jsonls = sorted(d.glob("*.jsonl"))
    if jsonls:
        return read_hellaswag_jsonl(jsonls[0]), str(jsonls[0])
    raise RltokError(f"{d}: no hellaswag_val.jsonl or derived *.txt[.bz2] file")
