"""Table of the first-run seed study (run_seeds.sh): per seed and initialisation, the held-out
evaluation of `rltok eval RUN --json` (256 validation documents of the built-in English corpus)
and which segmentation the policy settled into. Copies each run's config, metrics and summary
beside the table. Usage: python results/first-run/summarize.py [RUNS_DIR]"""

import json
import shutil
import sys
from pathlib import Path

import numpy as np

here = Path(__file__).parent
runs = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/first-run")


def basin(d):
    if d["whitespace_recall"] > 0.5:
        return "whitespace (chunks end on the space)"
    if d["word_start_recall"] > 0.3 and d["whitespace_recall"] < 0.1:
        return "word start (chunks end on a word's first letter)"
    return "neither (see the note)"


rows = []
for init, budget in ((0, "6 MB"), (1, "2 MB")):
    for seed in (42, 1, 2, 3, 4):
        name = f"init{init}_s{seed}"
        f = runs / f"{name}.eval.json"
        if not f.is_file() or not f.read_text().strip():
            continue
        d = json.loads(f.read_text())
        rows.append({"init_scale": init, "seed": seed, "bytes": budget, "bpb": d["bpb"], "bpb_se": d["bpb_se"],
                     "rate": d["rate"], "whitespace_recall": d["whitespace_recall"],
                     "word_start_recall": d["word_start_recall"],
                     "boundary_enrichment": d.get("boundary_enrichment"), "basin": basin(d)})
        dest = here / "runs" / name
        dest.mkdir(parents=True, exist_ok=True)
        for fn in ("config.json", "metrics.jsonl", "summary.json"):
            if (runs / name / fn).is_file():
                shutil.copyfile(runs / name / fn, dest / fn)
        shutil.copyfile(f, dest / "eval.json")

lines = ["| init_scale | seed | trained | val bits/byte ± SE (docs) | rate | whitespace recall | word-start recall | enrichment | segmentation |",
         "|---|---|---|---|---|---|---|---|---|"]
for r in rows:
    lines.append(f"| {r['init_scale']} | {r['seed']} | {r['bytes']} | {r['bpb']:.4f} ± {r['bpb_se']:.4f} | {r['rate']:.3f} | "
                 f"{r['whitespace_recall']:.3f} | {r['word_start_recall']:.3f} | {r['boundary_enrichment']:.2f} | {r['basin']} |")
for init in (0, 1):
    sel = [r for r in rows if r["init_scale"] == init]
    if sel:
        ws = sum(r["basin"].startswith("whitespace") for r in sel)
        b = np.array([r["bpb"] for r in sel])
        se = b.std(ddof=1) / np.sqrt(len(b)) if len(b) > 1 else float("nan")
        lines.append(f"\ninit_scale={init}: whitespace in {ws} of {len(sel)} seeds; bits/byte over seeds "
                     f"{b.mean():.4f} ± {se:.4f} (SE over seeds)")
(here / "seeds.md").write_text("\n".join(lines) + "\n")
(here / "seeds.json").write_text(json.dumps(rows, indent=1) + "\n")
print("\n".join(lines))
