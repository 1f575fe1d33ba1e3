"""Issue 38's compute-price sweep: the `tiny` preset on prose (2 MB, the study's corpus and split),
`rl` with no rate penalty (`boundary.rate_weight=0`) and a compute price λ in the REINFORCE reward
(`boundary.flop_price=λ`, `flop_price_in=reward`): each boundary costs λ times its marginal
training FLOPs, in the reward's nats-per-byte units, so the rate is whatever the price makes worth
it. Per run: the rate and bits/byte on the prose validation split (`rltok eval RUN --json`,
boundaries sampled, no calibration: the rate is the result), the test split beside it, and the
training FLOPs per byte at the validation rate. Resumable: a finished (λ, seed) is not run again.

    python results/rates/price_tiny.py --prices 0,0.1,0.3,1,3,10 --seeds 1 [--bytes 2M] [--out runs/price_tiny]
    python results/rates/price_tiny.py --prices 0.3,1,3 --seeds 2,3       # the middle prices' seeds

Record: results/rates/price_tiny.json (one row per λ and seed)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prices", default="0,0.1,0.3,1,3,10")
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--bytes", default="2M")
    ap.add_argument("--out", default=str(ROOT / "runs" / "price_tiny"))
    args = ap.parse_args()
    import rltok
    from rltok.flops import training_flops_per_byte

    rltok_cmd = [sys.executable, "-m", "rltok"]
    dest = Path(__file__).with_name("price_tiny.json")
    rec = json.loads(dest.read_text()) if dest.is_file() else {"preset": "tiny", "data": "prose", "rows": []}
    rec.update(bytes=args.bytes, settings="boundary.rate_weight=0 boundary.flop_price=λ (flop_price_in=reward)")
    for seed in (int(s) for s in args.seeds.split(",")):
        for lam in (float(p) for p in args.prices.split(",")):
            if any(r["seed"] == seed and r["flop_price"] == lam for r in rec["rows"]):
                continue
            d = Path(args.out) / f"price_{lam:g}_s{seed}"
            if not (d / "summary.json").is_file():
                cmd = rltok_cmd + ["train", "--method", "rl", "--preset", "tiny", "--data", "prose", "--bytes",
                                   args.bytes, "--seed", str(seed), "--threads", "1", "--no-progress", "--out", str(d),
                                   "--set", "boundary.rate_weight=0", "--set", f"boundary.flop_price={lam:g}"]
                subprocess.run(cmd + (["--resume"] if d.exists() else []), check=True)
            row = {"flop_price": lam, "seed": seed}
            for split in ("val", "test"):
                out = subprocess.run(rltok_cmd + ["eval", str(d), "--json", "--split", split],
                                     check=True, capture_output=True, text=True).stdout
                e = json.loads(out)
                row.update({f"{split}_rate": e["rate"], f"{split}_bpb": e["bpb"], f"{split}_bpb_se": e["bpb_se"],
                            f"{split}_docs": e["docs"], f"{split}_whitespace_recall": e.get("whitespace_recall")})
            s = json.loads((d / "summary.json").read_text())
            model = rltok.load(d)
            row["flops_per_byte"] = training_flops_per_byte(model, model.run_config, row["val_rate"]).per_byte
            row["train_seconds"] = s.get("train_seconds")
            rec["rows"].append(row)
            print(json.dumps(row), flush=True)
            dest.write_text(json.dumps(rec, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
