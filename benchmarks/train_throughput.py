#!/usr/bin/env python
"""RL step cost against the Uniform baseline, and MFU, measured side by side in one process.

    python benchmarks/train_throughput.py                       # tiny preset on this machine
    python benchmarks/train_throughput.py --preset 147M --steps 20   # on a GPU

Both methods train the same U-Net on the same documents; their steps alternate (rl, uniform,
uniform, rl, ...) so machine noise hits both alike, and the ratio is the median of paired
step-time ratios. Model FLOPs are counted analytically at the achieved rate (rltok/flops.py) and
divided by the dense matmul peak in the training dtype: measured here on a CPU (in the same run,
before and after), the data-sheet peak on a known GPU. Targets: RL step <= 1.10 x Uniform step;
MFU >= 40%. Built on rltok.bench, the code behind `rltok bench`.
"""

from __future__ import annotations

import argparse
import json
import sys

from rltok.bench import format_table, run_interleaved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per method")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--ratio-target", type=float, default=1.10)
    ap.add_argument("--mfu-target", type=float, default=0.40)
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    over = dict(s.split("=", 1) for s in args.overrides)
    rl, uni = run_interleaved(["rl", "uniform"], args.preset, steps=args.steps, warmup=args.warmup,
                              overrides=over, device=args.device)
    print(format_table([rl, uni]))
    import statistics

    ratio = statistics.median(a / b for a, b in zip(rl.times, uni.times))
    ok_ratio = ratio <= args.ratio_target
    ok_mfu = rl.mfu is not None and rl.mfu >= args.mfu_target
    print(f"target RL/Uniform step <= {args.ratio_target:.2f}: {ratio:.3f} {'PASS' if ok_ratio else 'FAIL'}")
    print(f"target MFU (rl) >= {100 * args.mfu_target:.0f}%: "
          f"{100 * (rl.mfu or 0):.1f}% {'PASS' if ok_mfu else 'FAIL'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ratio": ratio, "rl": rl.to_dict(times=True), "uniform": uni.to_dict(times=True)}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
