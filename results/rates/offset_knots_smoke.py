"""A smoke-scale first look at a conditioned policy holding the requested rate (issue 38), one
seed: the controller's offset as one number (K = 0) or as a function of the requested rate
(``boundary.rate_offset_knots=5``). Not the issue's measurement (tiny, 3 seeds).

    python results/rates/offset_knots_smoke.py [--steps 300] [--out runs/knots_smoke]

Each run: rltok train --method rl --preset smoke --data C4 --seed 1 --steps STEPS
--set boundary.rate_schedule=uniform:0.1:0.3 --set boundary.rate_integral_gain=1
--set boundary.rate_antiwindup=true [--set boundary.rate_offset_knots=5], one thread; then
rltok eval RUN --rate R --json on C4's validation split for R in 0.1, 0.15, 0.2, 0.3. The rates
are read from eval's JSON and written to results/rates/offset_knots_smoke.json."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
C4 = ROOT.parent / "shared" / "data" / "webtext" / "c4" / "c4_sample.jsonl"
RATES = (0.1, 0.15, 0.2, 0.3)
BASE = ["--set", "boundary.rate_schedule=uniform:0.1:0.3", "--set", "boundary.rate_integral_gain=1",
        "--set", "boundary.rate_antiwindup=true"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", default=str(ROOT / "runs" / "knots_smoke"))
    args = ap.parse_args()
    rltok = [sys.executable, "-m", "rltok"]
    rows = []
    for knots in (0, 5):
        d = Path(args.out) / f"knots_{knots}"
        if not (d / "summary.json").is_file():
            extra = ["--set", f"boundary.rate_offset_knots={knots}"] if knots else []
            cmd = rltok + ["train", "--method", "rl", "--preset", "smoke", "--data", str(C4), "--steps", str(args.steps),
                           "--seed", "1", "--threads", "1", "--no-progress", "--out", str(d)] + BASE + extra
            subprocess.run(cmd + (["--resume"] if d.exists() else []), check=True, capture_output=True)
        for r in RATES:
            out = subprocess.run(rltok + ["eval", str(d), "--data", str(C4), "--rate", str(r), "--json"],
                                 check=True, capture_output=True, text=True).stdout
            rec = json.loads(out)
            rows.append({"rate_offset_knots": knots, "requested_rate": r, "val_rate": rec["rate"],
                         "val_bpb": rec["bpb"], "steps": args.steps, "seed": 1})
            print(json.dumps(rows[-1]), flush=True)
    dest = Path(__file__).with_name("offset_knots_smoke.json")
    dest.write_text(json.dumps({"preset": "smoke", "data": "c4_sample (validation split)",
                                "schedule": "uniform:0.1:0.3", "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
