"""Issue 14's evidence: the one-stage tiny rl U-Net against the two-stage one at equal training
FLOPs per byte, from the study's cells (tools/study.py: variants ``rl`` and ``rl-2stage``, the
same seeds, data order, budget and evaluation sets).

    python tools/study.py cell 2M rl-2stage 1     # (and seeds 2, 3; rl's cells are the study's)
    python tools/two_stage_report.py              # results/two_stage/README.md, results.json

What each level cuts at (``rltok.analysis.level_stats``) is read from the cells; for the one-stage
runs it is measured here from their run directories (runs/study/RUNG/rl_sSEED), on the same 64
test documents and boundary draws as the two-stage cells.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
STUDY = Path(os.environ.get("RLTOK_STUDY_RESULTS", ROOT / "results" / "study"))
RUNS = Path(os.environ.get("RLTOK_STUDY_RUNS", ROOT / "runs" / "study"))
OUT = ROOT / "results" / "two_stage"
EVALS = ("test", "c4", "wikitext")
LEVEL_KEYS = ("bytes_per_chunk", "on_whitespace", "on_punctuation", "inside_words", "words_per_chunk",
              "word_start_recall", "clause_recall")


def _cells(rung: str, tag: str) -> dict[int, dict]:
    out = {}
    for p in sorted((STUDY / "cells" / rung).glob(f"{tag}_s*.json")):
        d = json.loads(p.read_text())
        out[int(d["seed"])] = d
    return out


def _mse(xs) -> str:
    from rltok.evaluate import standard_error

    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return "n/a"
    se = standard_error(xs)
    return f"{sum(xs) / len(xs):.3f}" + ("" if math.isnan(se) else f" ± {se:.3f}")


def _one_stage_levels(rung: str, tag: str, seed: int, docs) -> dict | None:
    import rltok
    from rltok.analysis import level_stats, segment_docs

    run = RUNS / rung / f"{tag}_s{seed}"
    if not (run / "model.safetensors").is_file():
        return None
    model = rltok.load(run)
    pieces, res = segment_docs(model, docs(), dtype=model.run_config.train.dtype)
    return level_stats(pieces, [r.boundaries for r in res])


# (one-stage tag, two-stage tag, what the pair matches)
# (the differences in parameters and FLOPs are computed from the cells' records in report())
PAIRS = (
    ("rl", "rl-2stage", "parameters and FLOPs: the main network moved up a level"),
    ("rl", "rl-2stage-deep", "FLOPs: 6 inner main layers over half the positions, "
                             "the outer early exit as the inner baseline"),
    ("rl-penalty", "rl-2stage-penalty", "as the first pair, with the paper's rate penalty only (no integral controller)"),
)


def report(rung: str) -> list[dict]:
    from rltok.config import build_config
    from rltok.data import load_splits

    docs_cache: list[list[bytes]] = []

    def docs() -> list[bytes]:  # the 64 test documents, loaded only when a one-stage run is measured
        if not docs_cache:
            cfg = build_config("rl", "tiny", overrides={"data.source": "english", "data.test_docs": 256})
            test = load_splits(cfg).test
            docs_cache.append([test.doc_bytes(i) for i in range(min(64, len(test)))])
        return docs_cache[0]

    # where a one-stage run directory is gone, its level statistics are the ones this report
    # recorded from it before (results.json), per seed
    before = {}
    if (OUT / "results.json").is_file():
        for r in json.loads((OUT / "results.json").read_text()):
            tag1 = r["pair"][0]
            for s, lv in zip(r.get("level_seeds", {}).get(tag1, r["seeds"]), r["levels"].get(tag1, [])):
                before[r["rung"], tag1, s] = lv
    one_stage_levels: dict[tuple[str, int], dict | None] = {}
    out = []
    for tag1, tag2, matched in PAIRS:
        one, two = _cells(rung, tag1), _cells(rung, tag2)
        seeds = sorted(set(one) & set(two))
        if not seeds:
            continue
        rows = {}
        for name, cells in ((tag1, one), (tag2, two)):
            c = [cells[s] for s in seeds]
            rows[name] = {
                "seeds": seeds, "params": [x["params"] for x in c], "flops_per_byte": [x["flops_per_byte"] for x in c],
                "train_rate_late": [x["train_rate_late"] for x in c],
                "rates": [x["test"].get("rates", [x["test"]["rate"]]) for x in c],
                "bytes_per_chunk": [x["test"].get("bytes_per_chunk") for x in c],
                **{e: [x[e]["bpb"] for x in c] for e in EVALS},
            }
        deltas = {e: [two[s][e]["bpb"] - one[s][e]["bpb"] for s in seeds] for e in EVALS}
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        d_flops = mean(rows[tag2]["flops_per_byte"]) / mean(rows[tag1]["flops_per_byte"]) - 1
        d_params = mean(rows[tag2]["params"]) / mean(rows[tag1]["params"]) - 1
        matched = f"{matched} (two-stage vs one: FLOPs per byte {d_flops:+.1%}, parameters {d_params:+.1%})"
        levels = {f"{tag2}, outer": [], f"{tag2}, inner": [], tag1: []}
        level_seeds: list[int] = []
        for s in seeds:
            st = two[s].get("stage_stats") or {}
            if "outer" in st:
                levels[f"{tag2}, outer"].append(st["outer"])
            if "inner" in st:
                levels[f"{tag2}, inner"].append(st["inner"])
            if (tag1, s) not in one_stage_levels:
                one_stage_levels[tag1, s] = (_one_stage_levels(rung, tag1, s, docs) if (RUNS / rung / f"{tag1}_s{s}").is_dir()
                                             else before.get((rung, tag1, s)))
            if one_stage_levels[tag1, s] is not None:
                levels[tag1].append(one_stage_levels[tag1, s])
                level_seeds.append(s)
        out.append({"rung": rung, "pair": [tag1, tag2], "matched": matched, "seeds": seeds, "rows": rows,
                    "delta_two_minus_one": deltas, "levels": levels, "level_seeds": {tag1: level_seeds}})
    return out


def render(rep: dict) -> str:
    rows, seeds = rep["rows"], rep["seeds"]
    lines = [f"## {rep['rung']} per run: `{rep['pair'][0]}` vs `{rep['pair'][1]}`, seeds {', '.join(map(str, seeds))}",
             "", f"Matched: {rep['matched']}. Mean ± SE over seeds.", "",
             "| model | params | train FLOPs/byte | train rate (2nd half) | eval rates (outer, inner) | "
             "bytes / innermost chunk | test bpb | C4 bpb | WikiText bpb |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        rates = r["rates"]
        outer = _mse([x[0] for x in rates])
        inner = _mse([x[1] for x in rates if len(x) > 1]) if any(len(x) > 1 for x in rates) else "–"
        lines.append(f"| {name} | {r['params'][0]:,} | {sum(r['flops_per_byte']) / len(seeds) / 1e6:.2f}M | "
                     f"{_mse(r['train_rate_late'])} | {outer}, {inner} | {_mse(r['bytes_per_chunk'])} | "
                     f"{_mse(r['test'])} | {_mse(r['c4'])} | {_mse(r['wikitext'])} |")
    d = rep["delta_two_minus_one"]
    lines += ["", f"`{rep['pair'][1]}` − `{rep['pair'][0]}`, paired by seed (same data order and evaluation draws): "
              + ", ".join(f"{e} {_mse(d[e])}" for e in EVALS)
              + " (per seed: " + "; ".join(f"{e} " + ", ".join(f"{x:+.3f}" for x in d[e]) for e in EVALS) + ").",
              "", "What each level cuts at (64 test documents; mean ± SE over seeds):", "",
              "| level | " + " | ".join(k.replace("_", " ") for k in LEVEL_KEYS) + " |",
              "|---|" + "---|" * len(LEVEL_KEYS)]
    for name, lv in rep["levels"].items():
        own = rep.get("level_seeds", {}).get(name)
        label = name if own is None or own == seeds else f"{name} (seeds {', '.join(map(str, own))})"
        if lv:
            lines.append(f"| {label} | " + " | ".join(_mse([x[k] for x in lv]) for k in LEVEL_KEYS) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rungs", default="2M")
    args = ap.parse_args(argv)
    reps = [p for r in args.rungs.split(",") for p in report(r)]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results.json").write_text(json.dumps(reps, indent=1) + "\n")
    (OUT / "tables.md").write_text("\n".join(render(r) for r in reps))
    print((OUT / "tables.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
