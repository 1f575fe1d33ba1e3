"""rltok bench"""

from __future__ import annotations

import json

from . import HelpFormatter, nonneg_int, positive_float, positive_int


def register(sub) -> None:
    from ..presets import PRESETS

    p = sub.add_parser(
        "bench", help="training throughput: bytes/s, model FLOP/s, MFU, peak memory",
        description="Time the real training step (the one `rltok train` runs) of a preset and "
                    "method(s) on real data. Model FLOPs are counted analytically at the achieved "
                    "boundary rate; MFU is against the data-sheet dense peak of known GPUs, else a "
                    "dense matmul measured in this process. Several --method values are measured "
                    "side by side, step by step, with their step-time ratio.",
        formatter_class=HelpFormatter)
    p.add_argument("--preset", default="tiny", help=f"model size: {', '.join(PRESETS)}")
    p.add_argument("--method", action="append", default=None,
                   help="boundary method; repeat (or comma-separate) to compare side by side (default: rl)")
    p.add_argument("--steps", type=positive_int, default=10, help="timed optimizer steps per method")
    p.add_argument("--warmup", type=nonneg_int, default=2, help="untimed steps per method first")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="device")
    p.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default=None, help="default: the preset's (auto: the faster here)")
    p.add_argument("--data", default=None, help="data source (default: the preset's)")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="sequences per step (default: the preset's global batch)")
    p.add_argument("--compile", action="store_true", help="torch.compile each Transformer block")
    p.add_argument("--peak-seconds", type=positive_float, default=1.0,
                   help="seconds spent measuring the matmul peak, before and after the steps")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override any config field, as in `rltok train`")
    p.add_argument("--init-from", action="append", default=None, metavar="RUN",
                   help="start the method this run was trained with from its weights (repeatable); "
                        "e.g. a trained rl run, so the step is timed at the learned boundary rate")
    p.add_argument("--json", action="store_true", help="print one JSON object per method")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..bench import format_table, run_interleaved
    from ..schema import _split_kv

    methods = [m for spec in (args.method or ["rl"]) for m in spec.split(",") if m]
    over: dict = dict(_split_kv(s) for s in args.overrides)
    if args.dtype:
        over["train.dtype"] = args.dtype
    if args.data:
        over["data.source"] = args.data
    if args.batch_size:
        over["train.batch_size"] = args.batch_size
        over["train.batch_bytes"] = 0
    if args.compile:
        over["train.compile"] = True
    results = run_interleaved(methods, args.preset, steps=args.steps, warmup=args.warmup,
                              overrides=over, device=args.device, progress=not args.no_progress,
                              peak_seconds=args.peak_seconds, init_from=args.init_from)
    if args.json:
        for r in results:
            print(json.dumps(r.to_dict()))
    else:
        print(format_table(results))
    return 0
