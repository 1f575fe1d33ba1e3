"""Issue 38's measurement of a conditioned model holding the request: the `tiny` preset on
prose, trained with rates drawn from uniform:0.1:0.3, rltok's integral controller with
anti-windup and the offset as a function of the requested rate (boundary.rate_offset_knots=5);
each run asked for 0.10 / 0.15 / 0.20 / 0.30 on the prose validation split, first as it stands,
then on the test split with the trim calibrated on validation (``--calibrate-rate``). Resumable; a finished run is
measured again only if its record is missing.

    python results/rates/knots_tiny.py --seeds 1,2,3 [--bytes 2M] [--out runs/knots_tiny]

Record: results/rates/knots_tiny.json (one row per seed and requested rate: the rate and
bits/byte on validation, raw and calibrated)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RATES = (0.1, 0.15, 0.2, 0.3)
SETTINGS = ["--set", "boundary.rate_schedule=uniform:0.1:0.3", "--set", "boundary.rate_integral_gain=1",
            "--set", "boundary.rate_antiwindup=true", "--set", "boundary.rate_offset_knots=5"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--bytes", default="2M")
    ap.add_argument("--out", default=str(ROOT / "runs" / "knots_tiny"))
    args = ap.parse_args()
    rltok = [sys.executable, "-m", "rltok"]
    dest = Path(__file__).with_name("knots_tiny.json")
    rec = json.loads(dest.read_text()) if dest.is_file() else {"preset": "tiny", "data": "prose", "rows": []}
    rec.update(bytes=args.bytes, settings=" ".join(SETTINGS[1::2]))
    for seed in (int(s) for s in args.seeds.split(",")):
        if any(r["seed"] == seed for r in rec["rows"]):
            continue
        d = Path(args.out) / f"s{seed}"
        if not (d / "summary.json").is_file():
            cmd = rltok + ["train", "--method", "rl", "--preset", "tiny", "--data", "prose", "--bytes", args.bytes,
                           "--seed", str(seed), "--threads", "1", "--no-progress", "--out", str(d)] + SETTINGS
            subprocess.run(cmd + (["--resume"] if d.exists() else []), check=True)
        for r in RATES:
            row = {"seed": seed, "requested_rate": r}
            # raw: the validation split as the model stands; calibrated: the trim bisected on the
            # validation split, then the test split scored (the rate it holds on unseen documents)
            for mode, extra in (("raw", []), ("calibrated_test", ["--calibrate-rate", "--split", "test"])):
                out = subprocess.run(rltok + ["eval", str(d), "--rate", str(r), "--json"] + extra,
                                     check=True, capture_output=True, text=True).stdout
                e = json.loads(out)
                row[f"{mode}_rate"], row[f"{mode}_bpb"] = e["rate"], e["bpb"]
            rec["rows"].append(row)
            print(json.dumps(row), flush=True)
        dest.write_text(json.dumps(rec, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
