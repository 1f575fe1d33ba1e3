"""A smoke-scale sign of life for the compute price in the REINFORCE reward (issue 38), one seed:
does the learned rate move with the price, and are there prices with an interior rate? Not the
issue's sweep (tiny, 3 seeds): a first look at which prices to sweep.

    python results/rates/price_reward_smoke.py [--steps 150] [--out runs/price_smoke]

Each run: rltok train --method rl --preset smoke --data C4 --set boundary.rate_weight=0
--set boundary.flop_price=LAMBDA (flop_price_in=reward, the default), one thread; its record
(final validation rate and bits/byte, training FLOPs per byte at that rate) is read from the run's
summary.json and written to results/rates/price_reward_smoke.json."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
C4 = ROOT.parent / "shared" / "data" / "webtext" / "c4" / "c4_sample.jsonl"
PRICES = (0.0, 0.1, 0.3, 1.0, 3.0, 10.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--out", default=str(ROOT / "runs" / "price_smoke"))
    args = ap.parse_args()
    import rltok
    from rltok.flops import training_flops_per_byte

    rows = []
    for lam in PRICES:
        d = Path(args.out) / f"price_{lam:g}"
        if not (d / "summary.json").is_file():
            cmd = [sys.executable, "-m", "rltok", "train", "--method", "rl", "--preset", "smoke", "--data", str(C4),
                   "--steps", str(args.steps), "--seed", "1", "--threads", "1", "--no-progress", "--out", str(d),
                   "--set", "boundary.rate_weight=0", "--set", f"boundary.flop_price={lam:g}"]
            if d.exists():
                cmd.append("--resume")
            subprocess.run(cmd, check=True, capture_output=True)
        s = json.loads((d / "summary.json").read_text())
        model = rltok.load(d)
        fc = training_flops_per_byte(model, model.run_config, s["val_rate"])
        rows.append({"flop_price": lam, "steps": args.steps, "seed": 1, "val_rate": s["val_rate"],
                     "val_bpb": s["val_bpb"], "val_bpb_se": s["val_bpb_se"], "flops_per_byte": fc.per_byte,
                     "val_whitespace_recall": s.get("val_whitespace_recall")})
        print(json.dumps(rows[-1]), flush=True)
    out = Path(__file__).with_name("price_reward_smoke.json")
    out.write_text(json.dumps({"preset": "smoke", "data": "c4_sample", "flop_price_in": "reward", "rows": rows},
                              indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
