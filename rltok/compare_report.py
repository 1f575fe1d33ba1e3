"""Aggregating a comparison's runs and writing results.json, results.md and curves.png.

Statistics (bits-per-byte of held-out documents, each scored as BOS + its first seq_len bytes):

* across documents: each document's bpb is averaged over a method's seeds, then mean ± standard
  error over documents (the paper's error bar, with seed noise averaged in);
* across seeds: each seed's mean bpb, then mean ± standard error over seeds (training noise);
* paired difference against ``--baseline``: per document, (method - baseline) on the
  seed-averaged values, mean ± standard error over documents. Pairing removes the variation
  between documents, so it resolves differences far smaller than the two error bars suggest.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from .evaluate import standard_error
from .flops import format_flops
from .checkpoint import write_bytes_atomic
from .metrics import read_metrics

_MEAN_KEYS = ("rate", "whitespace_recall", "whitespace_precision", "word_start_recall", "bpe_precision", "bpe_recall", "bpe_f1",
              "boundary_enrichment", "start_surprisal_ratio",
              "train_rate", "train_rate_late", "target_rate", "flops_per_byte", "train_flops", "bytes_per_s", "params", "train_bytes",
              "corpus_bpb")


def _nanmean(vals: list) -> float:
    v = np.array([np.nan if x is None else float(x) for x in vals], dtype=float)
    return float(np.nanmean(v)) if np.isfinite(v).any() else float("nan")


def _pick_baseline(spec, by_tag: dict[str, list[dict]]) -> str | None:
    if not spec.baseline:
        return None
    if spec.baseline in by_tag:
        return spec.baseline
    for v in spec.variants:
        if v.method == spec.baseline and v.tag in by_tag:
            return v.tag
    return None


def aggregate(spec, records: list[dict], corpus_name: str, n_docs: int, ref_path: Path) -> dict[str, Any]:
    by_tag: dict[str, list[dict]] = {}
    for r in records:
        by_tag.setdefault(r["tag"], []).append(r)
    base_tag = _pick_baseline(spec, by_tag)
    per_doc = {tag: np.mean([r["per_doc_bpb"] for r in rs], axis=0) for tag, rs in by_tag.items()}
    methods = []
    for v in spec.variants:
        rs = by_tag.get(v.tag)
        if not rs:
            methods.append({"tag": v.tag, "method": v.method, "overrides": v.overrides, "seeds": [],
                            "status": "pending"})
            continue
        seed_means = np.array([r["bpb"] for r in rs])
        m: dict[str, Any] = {
            "tag": v.tag, "method": v.method, "overrides": v.overrides, "status": "done",
            "seeds": [r["seed"] for r in rs], "bpb": float(per_doc[v.tag].mean()),
            "bpb_se_docs": standard_error(per_doc[v.tag]), "bpb_se_seeds": standard_error(seed_means),
            "bpb_per_seed": seed_means.tolist(),
            "rate_se_seeds": standard_error(np.array([r["rate"] for r in rs], dtype=float)),
        }
        for k in _MEAN_KEYS:
            m[k] = _nanmean([r.get(k) for r in rs])
        if base_tag is not None and v.tag != base_tag and len(per_doc[v.tag]) == len(per_doc[base_tag]):
            d = per_doc[v.tag] - per_doc[base_tag]
            m["diff_vs_baseline"], m["diff_se"] = float(d.mean()), standard_error(d)
            m["docs_better_than_baseline"] = float((d < 0).mean())
        methods.append(m)
    mark_matching(methods)
    ref_info_path = ref_path.with_suffix(".info.json")
    ref_info = json.loads(ref_info_path.read_text()) if ref_info_path.is_file() else {}
    eval_bytes = sorted({r["bytes"] for r in records})
    return {
        "settings": {
            "preset": spec.preset, "recipe": spec.recipe, "data": spec.data, "bytes": spec.total_bytes,
            "seeds": spec.seeds, "methods": [v.text for v in spec.variants], "set": spec.overrides,
            "eval_data": corpus_name, "eval_docs": n_docs, "eval_bytes": eval_bytes,
            "eval_samples": spec.eval_samples, "eval_seed": spec.eval_seed, "baseline": base_tag,
            "bpe_reference": {"path": str(ref_path), **ref_info},
        },
        "methods": methods,
        "runs": records,
    }


RATE_TOLERANCE = 0.01  # a rate-matched cell holds r* within this, late in training and at evaluation
FLOP_TOLERANCE = 0.03  # a FLOP-matched cell is within 3% of the rl cell's training FLOPs per byte
# methods whose rate is set to the target (by training or by fitting a BPE vocabulary to it)
RATE_MATCHED_METHODS = ("rl", "uniform", "nawrot", "hnet", "bpe", "entropy")


def holds_rate(rate: float, late: float, target: float) -> bool:
    """Within RATE_TOLERANCE of ``target`` at evaluation (``rate``) and over the second half of
    training (``late``; not judged when nan)."""
    return bool(abs(rate - target) <= RATE_TOLERANCE and (not math.isfinite(late) or abs(late - target) <= RATE_TOLERANCE))


def mark_matching(methods: list[dict]) -> None:
    """Per finished method: ``flops_vs_rl`` (its training FLOPs per byte over the first rl cell's)
    and ``flop_matched`` (within FLOP_TOLERANCE); for the methods steered or fitted to the target
    rate, ``rate_matched``: the second half of training and the evaluation both within
    RATE_TOLERANCE of r* (None for methods at their natural rate)."""
    done = [m for m in methods if m["status"] == "done"]
    ref = next((m for m in done if m["method"] == "rl"), None)
    for m in done:
        if ref is not None and math.isfinite(ref.get("flops_per_byte", float("nan"))):
            m["flops_vs_rl"] = m["flops_per_byte"] / ref["flops_per_byte"]
            m["flop_matched"] = bool(abs(m["flops_vs_rl"] - 1) <= FLOP_TOLERANCE)
        if m["method"] in RATE_MATCHED_METHODS and math.isfinite(m.get("target_rate", float("nan"))):
            m["rate_matched"] = holds_rate(m["rate"], m.get("train_rate_late", float("nan")), m["target_rate"])
        else:
            m["rate_matched"] = None


def _matching_cell(m: dict) -> str:
    flops = "—" if "flops_vs_rl" not in m else f"{m['flops_vs_rl']:.2f}" + ("" if m["flop_matched"] else " †")
    return flops


# -- writing ---------------------------------------------------------------------------------------

def _f(x, nd=4) -> str:
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{nd}f}"


def _pm(x, se, nd=4) -> str:
    if x is None or not math.isfinite(x):
        return "—"
    return f"{x:.{nd}f} ± {se:.{nd}f}" if se is not None and math.isfinite(se) else f"{x:.{nd}f}"


def _count(x) -> str:
    if x is None or not math.isfinite(x):
        return "—"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def method_table(results: dict) -> str:
    s = results["settings"]
    base = s.get("baseline")
    head = ["method", "seeds", "bits/byte ± SE (docs)", "± SE (seeds)"]
    if base:
        head.append(f"Δ vs {base} (paired)")
    head += ["rate", "train rate (2nd half)", "ws recall", "ws precision", "word-start recall", "BPE F1",
             "train FLOPs", "FLOPs/byte vs rl", "bytes/s", "params"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for m in results["methods"]:
        if m["status"] != "done":
            row = [m["tag"], "0", "pending"] + ["—"] * (len(head) - 3)
        else:
            row = [m["tag"], str(len(m["seeds"])), _pm(m["bpb"], m["bpb_se_docs"]),
                   "± " + _f(m["bpb_se_seeds"]) if math.isfinite(m["bpb_se_seeds"]) else "—"]
            if base:
                row.append("(baseline)" if m["tag"] == base else _pm(m.get("diff_vs_baseline"), m.get("diff_se")))
            off = " *" if m.get("rate_matched") is False else ""
            row += [_f(m["rate"], 3) + off, _f(m.get("train_rate_late"), 3), _f(m["whitespace_recall"], 3),
                    _f(m["whitespace_precision"], 3), _f(m.get("word_start_recall", float("nan")), 3),
                    _f(m["bpe_f1"], 3), format_flops(m["train_flops"]), _matching_cell(m),
                    _count(m["bytes_per_s"]), _count(m["params"])]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def run_table(records: list[dict]) -> str:
    head = ["run", "seed", "bits/byte ± SE", "rate", "train rate", "ws recall", "BPE F1", "FLOPs/byte",
            "bytes/s", "train s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in records:
        lines.append("| " + " | ".join([
            r["tag"], str(r["seed"]), _pm(r["bpb"], r["bpb_se"]), _f(r["rate"], 3), _f(r.get("train_rate"), 3),
            _f(r["whitespace_recall"], 3), _f(r["bpe_f1"], 3), format_flops(r["flops_per_byte"]),
            _count(r["bytes_per_s"]), _f(r.get("train_seconds"), 0)]) + " |")
    return "\n".join(lines)


def markdown(results: dict, records: list[dict]) -> str:
    s = results["settings"]
    ref = s["bpe_reference"]
    out = [
        "# rltok compare",
        "",
        f"Preset `{s['preset']}`{' + recipe `' + s['recipe'] + '`' if s['recipe'] else ''}, "
        f"data `{s['data'] or '(preset default)'}`, "
        f"{'preset byte budget' if s['bytes'] is None else format(s['bytes'], ',') + ' training bytes'} per run, "
        f"seeds {', '.join(map(str, s['seeds']))}.",
        f"Evaluation: {s['eval_docs']} documents of {s['eval_data']} "
        f"(BOS + the first seq_len bytes each; {', '.join(format(b, ',') for b in s['eval_bytes'])} bytes), "
        f"{s['eval_samples']} boundary sample(s) per document, seed {s['eval_seed']}.",
        "",
        method_table(results),
        "",
        "* bits/byte: mean over documents of each document's bits-per-byte (averaged over the seeds), "
        "± its standard error over documents; ± SE (seeds): standard error of the per-seed means.",
    ]
    if s.get("baseline"):
        out.append(f"* Δ vs {s['baseline']}: per-document difference of seed-averaged bits/byte, "
                   f"mean ± SE over documents (negative = better than {s['baseline']}).")
    out += [
        "* rate: boundaries (chunk ends, forced first/last included) per byte on the evaluation documents; "
        "for bpe-lm its tokens per byte. ws recall: whitespace bytes that end a chunk; ws precision: "
        "decided chunk ends that are whitespace.",
        f"* BPE F1: agreement of the boundaries with a byte-level BPE fitted to the target rate on the "
        f"training split (vocabulary {ref.get('vocab_size', '?'):,}, "
        f"{_f(ref.get('rate'), 4)} tokens per byte), at decided positions.",
        "* train FLOPs: analytic training FLOPs (rltok/flops.py: 6 x matmul parameters per position "
        "plus causal attention) at each run's mean training rate, times its training bytes. "
        "bytes/s: median training throughput.",
        f"* \\* after a rate: a method steered or fitted to the target rate ({', '.join(RATE_MATCHED_METHODS)}) "
        f"that is more than {RATE_TOLERANCE} off it at evaluation or over the second half of training "
        f"(not rate-matched). † after FLOPs/byte vs rl: more than {FLOP_TOLERANCE:.0%} away from the rl "
        f"cell's training FLOPs per byte (not FLOP-matched).",
        "",
        "## Runs",
        "",
        run_table(records),
        "",
    ]
    return "\n".join(out)


def _series(run_dir: str) -> tuple[dict[int, dict], list[dict]]:
    steps, evals = {}, []
    for r in read_metrics(Path(run_dir)):
        if "event" not in r and "bytes" in r:
            steps[int(r["bytes"])] = r
        elif r.get("event") in ("eval", "final_eval") and "val_bpb" in r:
            evals.append(r)
    return steps, evals


def plot_curves(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_bpb, ax_rate) = plt.subplots(1, 2, figsize=(13, 4.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    bpb_series: list[tuple[list, list]] = []
    by_tag: dict[str, list[dict]] = {}
    for r in results["runs"]:
        by_tag.setdefault(r["tag"], []).append(r)
    for i, (tag, rs) in enumerate(by_tag.items()):
        c = colors[i % len(colors)]
        series = [_series(r["run_dir"]) for r in rs]
        common = sorted(set.intersection(*(set(s[0]) for s in series))) if series else []
        if common:
            x = np.array(common, dtype=float)
            for key, ax in (("bpb", ax_bpb), ("rate", ax_rate)):
                ys = np.array([[s[0][b].get(key, np.nan) for b in common] for s in series], dtype=float)
                if np.isfinite(ys).any():
                    if key == "bpb":
                        bpb_series.append((list(x), list(np.nanmean(ys, axis=0))))
                    ax.plot(x, np.nanmean(ys, axis=0), color=c, lw=1.3,
                            label=f"{tag} (train, {len(rs)} seed{'s' if len(rs) > 1 else ''})")
        ev: dict[int, list[float]] = {}
        for s in series:
            for e in s[1]:
                ev.setdefault(int(e["bytes"]), []).append(e["val_bpb"])
        if ev:
            xs = sorted(ev)
            bpb_series.append((xs, [float(np.mean(ev[b])) for b in xs]))
            ax_bpb.plot(xs, [np.mean(ev[b]) for b in xs], color=c, ls="--", marker="o", ms=3, lw=1,
                        label=f"{tag} (validation)")
    from .viz import focus_ylim

    focus_ylim(ax_bpb, bpb_series)
    ax_bpb.set_xlabel("training bytes seen")
    ax_bpb.set_ylabel("bits per byte")
    ax_bpb.set_title("bits per byte")
    ax_rate.set_xlabel("training bytes seen")
    ax_rate.set_ylabel("boundaries (or tokens) per byte")
    ax_rate.set_title("rate")
    for ax in (ax_bpb, ax_rate):
        ax.grid(alpha=0.3)
    ax_bpb.legend(fontsize=7, ncol=2)
    if ax_rate.lines:
        ax_rate.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _jsonable(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, np.integer)):
        return _jsonable(x.item())
    return x


def write_reports(out: Path, results: dict, records: list[dict]) -> None:
    write_bytes_atomic(out / "results.json", (json.dumps(_jsonable(results), indent=2) + "\n").encode())
    write_bytes_atomic(out / "results.md", markdown(results, records).encode())
    if records:
        plot_curves(results, out / "curves.png")
