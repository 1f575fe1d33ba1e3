"""Tables for results/rates/README.md from the runs of run.sh: held-out bits/byte, achieved rate
and training FLOPs per byte at that rate for every run, and the rate-conditioned model at each
rate paired against the single-rate model trained there (same documents, same boundary draws).
Usage: python results/rates/summarize.py [RUNS_DIR]   (writes results.json and tables.md here)"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

here = Path(__file__).parent
runs = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/rates")


def ev(args):
    out = subprocess.run([sys.executable, "-m", "rltok", "eval", *args, "--json"], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(out.stderr.strip().splitlines()[-1])
    return json.loads(out.stdout.strip().splitlines()[-1])


def flops_at(run, rate):
    import rltok
    from rltok.flops import training_flops_per_byte

    m = rltok.load(run)
    return training_flops_per_byte(m, m.run_config, rate).per_byte


res = {"runs": {}, "conditioned": {}}
for d in sorted(p for p in runs.iterdir() if p.is_dir()):
    f = runs / f"{d.name}.eval.json"
    if not (d / "summary.json").is_file() or not f.is_file():
        continue
    e = json.loads(f.read_text())
    metrics = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    train_rates = [x["rate"] for x in metrics if "event" not in x and "rate" in x]
    half = train_rates[len(train_rates) // 2:]
    res["runs"][d.name] = {"bpb": e["bpb"], "bpb_se": e["bpb_se"], "rate": e["rate"],
                           "train_rate_2nd_half": float(np.mean(half)) if half else None,
                           "whitespace_recall": e["whitespace_recall"],
                           "flops_per_byte": flops_at(d, e["rate"])}
cond = runs / "cond_0.1-0.3"
for r in ("0.1", "0.2", "0.3"):
    fixed = runs / f"fixed_r{r}"
    if cond.is_dir() and fixed.is_dir():
        p = ev([str(cond), "--rate", r, "--against", str(fixed)])
        res["conditioned"][r] = {"bpb": p["bpb"], "bpb_se": p["bpb_se"], "rate": p["rate"],
                                 "fixed_bpb": p["against"]["bpb"], "fixed_rate": p["against"]["rate"],
                                 "paired_diff": p["against"]["paired"]["diff"], "paired_se": p["against"]["paired"]["se"]}
ref = runs / "fixed_r0.2"
for name in res["runs"]:
    if name != ref.name and ref.is_dir():
        p = ev([str(runs / name), "--against", str(ref)])["against"]["paired"]
        res["runs"][name]["vs_fixed_0.2"] = {"diff": p["diff"], "se": p["se"]}
(here / "results.json").write_text(json.dumps(res, indent=1) + "\n")

lines = ["| run | val bits/byte ± SE | paired vs fixed_r0.2 | val rate | train rate (2nd half) | whitespace recall | training FLOPs/byte at val rate |",
         "|---|---|---|---|---|---|---|"]
for name, r in res["runs"].items():
    tr = f"{r['train_rate_2nd_half']:.3f}" if r["train_rate_2nd_half"] is not None else "n/a"
    vs = r.get("vs_fixed_0.2")
    vs = f"{vs['diff']:+.4f} ± {vs['se']:.4f}" if vs else "—"
    lines.append(f"| {name} | {r['bpb']:.4f} ± {r['bpb_se']:.4f} | {vs} | {r['rate']:.3f} | {tr} | {r['whitespace_recall']:.3f} | {r['flops_per_byte'] / 1e6:.2f}M |")
lines += ["", "| requested rate | conditioned: rate, bits/byte | single-rate model: rate, bits/byte | paired difference (cond − single) |",
          "|---|---|---|---|"]
for r, c in res["conditioned"].items():
    lines.append(f"| {r} | {c['rate']:.3f}, {c['bpb']:.4f} ± {c['bpb_se']:.4f} | {c['fixed_rate']:.3f}, {c['fixed_bpb']:.4f} | "
                 f"{c['paired_diff']:+.4f} ± {c['paired_se']:.4f} |")
(here / "tables.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
