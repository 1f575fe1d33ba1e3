"""Downstream tasks, 0-shot: the paper's target bits-per-byte and lm-eval-style accuracies.

Per task (spec section 6):

* ``bpb``: bits-per-byte of the gold continuation given the context, per item
  ``-log p(target) / (ln 2 * utf8_bytes(target))``, mean over items ± standard error (the paper's
  v2 metric; LAMBADA's target is the last word with its leading space).
* ``acc``: the choice with the lowest total NLL is the gold one (lm-eval ``acc``).
* ``acc_norm``: lm-eval's: the choice with the lowest NLL per character of the choice (its length
  in characters without the leading delimiter) is the gold one.
* ``acc_bytes``: rltok's: the lowest NLL per byte of the scored continuation (delimiter included),
  the natural unit of a byte model. It differs from ``acc_norm`` by the delimiter and on non-ASCII
  text, so it has its own name.
* LAMBADA: ``acc`` is lm-eval's lambada_openai ``acc``: every byte of the target word is the
  model's argmax given the true prefix. ``greedy_acc`` decodes greedily with ``rltok.generate``
  and needs the word to come out followed by a non-letter; it is reported as missing when this
  build has no generation.

With ``gold_only`` only the gold continuations are scored (bits-per-byte without accuracies:
about a quarter of the work on HellaSwag).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np
from torch import nn

from .formats import TaskItem
from .scoring import Request, RequestScore, as_bytes, score_requests

MISSING_GENERATION = "missing (needs generation: rltok.generate)"


@dataclass
class TaskResult:
    task: str
    items: int
    bpb: float
    bpb_se: float
    acc: float | None
    acc_norm: float | None  # lm-eval's: NLL per character of the choice
    acc_bytes: float | None  # rltok's: NLL per byte of the continuation
    greedy_acc: float | str | None  # LAMBADA only: a number, or why it is missing
    truncated: int  # items whose context was left-truncated to the model's window
    target_bytes: int
    samples: int
    source: str = ""
    per_item: list[dict] = field(default_factory=list)

    def to_dict(self, per_item: bool = False) -> dict:
        d = asdict(self)
        if not per_item:
            d.pop("per_item")
        return d


def mean_se(x: Sequence[float]) -> tuple[float, float]:
    a = np.asarray(x, dtype=float)
    if len(a) == 0:
        return float("nan"), float("nan")
    se = float(a.std(ddof=1) / math.sqrt(len(a))) if len(a) > 1 else float("nan")
    return float(a.mean()), se


def aggregate(task: str, items: Sequence[TaskItem], scores: Sequence[Sequence[RequestScore | None]],
              samples: int = 1, source: str = "") -> TaskResult:
    """Metrics from per-choice scores (``scores[i][j]`` for choice j of item i; None where a
    choice was not scored)."""
    bpb, acc, acc_norm, acc_bytes, greedy, per = [], [], [], [], [], []
    trunc, tbytes = 0, 0
    for it, sc in zip(items, scores):
        g = sc[it.gold]
        bpb.append(g.bits_per_byte)
        trunc += int(g.truncated)
        tbytes += g.n_bytes
        rec = {"id": it.id, "bpb": g.bits_per_byte}
        if all(s is not None for s in sc) and len(sc) > 1:
            nll = np.array([s.nll for s in sc])
            per_byte = np.array([s.nll / max(1, s.n_bytes) for s in sc])
            per_char = np.array([s.nll / max(1, len(_without_delimiter(c))) for s, c in zip(sc, it.choices)])
            acc.append(float(np.argmin(nll) == it.gold))
            acc_norm.append(float(np.argmin(per_char) == it.gold))
            acc_bytes.append(float(np.argmin(per_byte) == it.gold))
            rec.update(nll=nll.tolist(), pred=int(np.argmin(nll)), pred_norm=int(np.argmin(per_char)),
                       pred_bytes=int(np.argmin(per_byte)))
        if len(sc) == 1:
            greedy.append(g.greedy)
            rec["greedy"] = g.greedy
        per.append(rec)
    m, se = mean_se(bpb)
    single = bool(items) and all(len(it.choices) == 1 for it in items)
    return TaskResult(
        task=task, items=len(items), bpb=m, bpb_se=se,
        acc=(float(np.mean(greedy)) if single and greedy else float(np.mean(acc)) if acc else None),
        acc_norm=float(np.mean(acc_norm)) if acc_norm else None,
        acc_bytes=float(np.mean(acc_bytes)) if acc_bytes else None,
        greedy_acc=None, truncated=trunc, target_bytes=tbytes, samples=samples, source=source,
        per_item=per)


def _without_delimiter(choice: str) -> str:
    # lm-eval's target_delimiter " " is not part of the choice whose length acc_norm divides by
    return choice[1:] if choice.startswith(" ") else choice


def score_items(model: nn.Module, items: Sequence[TaskItem], *, gold_only: bool = False,
                **kw) -> list[list[RequestScore | None]]:
    """Score every choice (or only the gold one) of every item in one sorted, batched pass."""
    reqs: list[Request] = []
    where: list[tuple[int, int]] = []
    for i, it in enumerate(items):
        ctx = as_bytes(it.context)
        for j, c in enumerate(it.choices):
            if gold_only and j != it.gold:
                continue
            reqs.append(Request(ctx, as_bytes(c)))
            where.append((i, j))
    res = score_requests(model, reqs, **kw)
    out: list[list[RequestScore | None]] = [[None] * len(it.choices) for it in items]
    for (i, j), r in zip(where, res):
        out[i][j] = r
    return out


def greedy_word_accuracy(model: nn.Module, items: Sequence[TaskItem], *, batch_size: int = 16,
                         mode: str = "sample", seed: int = 0, dtype: str = "auto",
                         progress: bool = False) -> float | str:
    """LAMBADA by greedy decoding: generate len(target) + 1 bytes after the context (the prompt
    keeps its last seq_len - 1 bytes); correct if they start with the target word and the word
    ends there (the next byte, if any, is not a letter or digit; end of document counts as an
    end). Boundaries while decoding: ``mode`` (sampled from ``seed``, or greedy)."""
    try:
        from ..generate import generate
    except ImportError:
        return MISSING_GENERATION
    correct = 0
    rng = range(0, len(items), batch_size)
    if progress:
        from tqdm import tqdm

        rng = tqdm(rng, desc="lambada greedy", unit="batch", leave=False)
    for lo in rng:
        chunk = items[lo:lo + batch_size]
        n_new = max(len(as_bytes(it.target)) for it in chunk) + 1
        res = generate(model, [as_bytes(it.context) for it in chunk], n_new, temperature=0.0,
                       boundary_mode=mode, seed=seed, dtype=dtype)
        for it, g in zip(chunk, res):
            o = getattr(g, "output", g)
            o = as_bytes(o) if isinstance(o, str) else bytes(o)
            t = as_bytes(it.target)
            if o.startswith(t):
                nxt = o[len(t):len(t) + 1]
                correct += int(not (nxt and (nxt.isalpha() or nxt.isdigit())))
    return correct / max(1, len(items))


def evaluate_tasks(model: nn.Module, tasks: dict[str, tuple[list[TaskItem], str]], *, samples: int = 1,
                   seed: int = 0, mode: str = "sample", batch_size: int = 16, dtype: str = "auto",
                   gold_only: bool = False, generation: bool = True, progress: bool = False) -> list[TaskResult]:
    results = []
    for name, (items, source) in tasks.items():
        scores = score_items(model, items, gold_only=gold_only, samples=samples, seed=seed, mode=mode,
                             batch_size=batch_size, dtype=dtype, progress=name if progress else False)
        res = aggregate(name, items, scores, samples=1 if mode == "greedy" else samples, source=source)
        if name == "lambada":
            res.greedy_acc = (greedy_word_accuracy(model, items, batch_size=batch_size, mode=mode, seed=seed,
                                                   dtype=dtype, progress=progress) if generation else "skipped")
        results.append(res)
    return results


def format_table(results: Sequence[TaskResult]) -> str:
    def pct(x):
        return "-" if x is None else f"{100 * x:.1f}"

    lines = [f"{'task':<10} {'items':>6}  {'target bpb':>17}  {'acc':>5}  {'acc_norm':>8}  {'acc_bytes':>9}  "
             f"{'greedy':>6}  {'truncated':>9}", "-" * 86]
    for r in results:
        g = r.greedy_acc
        gs = pct(g) if isinstance(g, float) else ("-" if g is None else "n/a")
        lines.append(f"{r.task:<10} {r.items:>6}  {r.bpb:>8.4f} ± {r.bpb_se:<6.4f}  {pct(r.acc):>5}  "
                     f"{pct(r.acc_norm):>8}  {pct(r.acc_bytes):>9}  {gs:>6}  {r.truncated:>9}")
    return "\n".join(lines)
