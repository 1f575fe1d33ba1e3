"""Training-step throughput of every method at one preset: seconds per optimizer step, bytes/s,
analytic FLOPs per byte (rltok.flops) and the FLOP rate they imply. Used to size a comparison's
byte budget.

    PYTHONPATH=. python benchmarks/method_step.py --preset tiny --data ../shared/data/webtext/c4/c4_sample.jsonl \
        --methods rl,uniform,stride,whitespace,nawrot,hnet,bpe,bytes,bpe-lm --steps 4 --threads 2

bpe and bpe-lm need a tokenizer: ``--tokenizer FILE`` (e.g. a comparison's bpe_reference.json),
else one is fitted to the target rate on the training split first (not timed).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--data", default="stdlib")
    p.add_argument("--methods", default="rl,uniform,stride,whitespace,nawrot,hnet,bpe,bytes,bpe-lm")
    p.add_argument("--steps", type=int, default=4, help="timed steps (after 2 warm-up steps)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    p.add_argument("--tokenizer", default=None, help="BPE for bpe / bpe-lm (default: fit one)")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from rltok.methods import get_method
    from rltok.schema import apply_overrides
    from rltok.config import build_config
    from rltok.data import load_splits
    from rltok.data.loader import SequenceDataset
    from rltok.precision import autocast_for
    from rltok.flops import format_flops, training_flops_per_byte
    from rltok.objectives import training_loss

    rows = []
    splits = None
    for method in args.methods.split(","):
        cfg = build_config(method, args.preset, overrides={"data.source": args.data})
        apply_overrides(cfg, args.overrides)
        if args.tokenizer and hasattr(cfg.boundary, "tokenizer"):
            cfg.boundary.tokenizer = args.tokenizer
        splits = splits or load_splits(cfg)
        spec = get_method(method)
        run_dir = Path(tempfile.mkdtemp(prefix=f"bench-{method}-"))
        if spec.setup is not None:
            spec.setup(cfg, splits.train, run_dir)
        torch.manual_seed(0)
        model = spec.build(cfg, run_dir)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
        ds = SequenceDataset(splits.train, cfg.model.seq_len, cfg.train.seed, cfg.data.packing)
        micro = cfg.train.micro_batch or cfg.train.batch_size
        amp = autocast_for(torch.device("cpu"), cfg.train.dtype)
        rates, times = [], []
        for step in range(2 + args.steps):
            t0 = time.perf_counter()
            idx = ds.step_indices(step, cfg.train.batch_size)
            for j in range(0, len(idx), micro):
                with amp:
                    sl = training_loss(model, ds.batch(idx[j:j + micro]), cfg)
                sl.loss.backward()
                if "n_boundary" in sl.stats:
                    rates.append(float(sl.stats["n_boundary"] / sl.stats["n_valid"]))
            opt.step()
            opt.zero_grad(set_to_none=True)
            if step >= 2:
                times.append(time.perf_counter() - t0)
        sec = sorted(times)[len(times) // 2]
        rate = sum(rates) / len(rates) if rates else None
        fc = training_flops_per_byte(model, cfg, rate)  # the flat byte LM ignores the rate
        bps = cfg.bytes_per_step / sec
        rows.append((method, sec, bps, fc.per_byte, fc.per_byte * bps, rate,
                     sum(p.numel() for p in model.parameters())))
        print(f"{method:11s} {sec:6.2f} s/step  {bps:8,.0f} bytes/s  {format_flops(fc.per_byte)}FLOP/byte  "
              f"{format_flops(fc.per_byte * bps)}FLOP/s  rate {rate if rate is None else round(rate, 3)}  "
              f"params {rows[-1][-1]:,}", flush=True)
    print()
    print("| method | s/step | bytes/s | FLOPs/byte | FLOP/s | rate | params |")
    print("|---|---|---|---|---|---|---|")
    for m, sec, bps, fpb, fps, rate, n in rows:
        print(f"| {m} | {sec:.2f} | {bps:,.0f} | {format_flops(fpb)} | {format_flops(fps)} | "
              f"{'—' if rate is None else f'{rate:.3f}'} | {n:,} |")


if __name__ == "__main__":
    main()
