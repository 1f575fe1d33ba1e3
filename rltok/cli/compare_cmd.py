"""rltok compare"""

from __future__ import annotations

from pathlib import Path

from . import HelpFormatter, parse_size, positive_int


def register(sub) -> None:
    from ..presets import PRESETS

    p = sub.add_parser(
        "compare", help="train and evaluate several boundary methods in one compute-matched harness",
        description="Train every method x seed with the same preset, data, data order, byte budget "
                    "and schedule (finished runs in --out are skipped, unfinished ones resumed), "
                    "evaluate all on the same held-out documents, and write DIR/results.md, "
                    "DIR/results.json and DIR/curves.png.",
        epilog="Method syntax: METHOD[:KEY=VALUE...][@TAG], e.g. "
               "--methods rl,uniform,rl:gamma=1@rl-nodiscount,bytes:seeds=1. KEY is any --set key; "
               "seeds=N uses only the first N seeds; policy_scale is an alias of boundary.scale.",
        formatter_class=HelpFormatter)
    p.add_argument("--methods", required=True,
                   help="comma-separated methods with optional overrides (see below)")
    p.add_argument("--out", required=True, help="comparison directory (created, or continued)")
    p.add_argument("--preset", default="tiny", help=f"model size and optimisation: {', '.join(PRESETS)}")
    p.add_argument("--recipe", default="", help="named settings applied after the preset, to every method")
    p.add_argument("--data", default=None, help="training data source (default: the preset's)")
    p.add_argument("--bytes", type=parse_size, default=None, help="training bytes per run (default: the preset's)")
    p.add_argument("--seeds", default="1", help="comma-separated training seeds, e.g. 1,2,3")
    p.add_argument("--eval-data", default=None,
                   help="evaluate on all documents of this source (default: the validation split of --data)")
    p.add_argument("--eval-docs", type=positive_int, default=None, help="evaluate on the first N documents only")
    p.add_argument("--eval-samples", type=positive_int, default=1, help="boundary samples averaged per document")
    p.add_argument("--eval-batch-size", type=positive_int, default=8, help="documents per evaluation forward pass")
    p.add_argument("--baseline", default=None,
                   help="method tag for the paired-difference column (default: uniform if compared)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field in every method that has it (bare names when unique)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None, help="device (default: cuda if available)")
    p.add_argument("--no-train", action="store_true",
                   help="train nothing: evaluate and report the runs that are finished")
    p.add_argument("--dry-run", action="store_true", help="print the planned runs and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..compare import CompareSpec, parse_seeds, parse_variants, plan, run_compare
    from ..compare_report import method_table

    variants = parse_variants(args.methods)
    baseline = args.baseline
    if baseline is None and any(v.tag == "uniform" for v in variants):
        baseline = "uniform"
    spec = CompareSpec(variants=variants, out=Path(args.out), preset=args.preset, recipe=args.recipe,
                       data=args.data, total_bytes=args.bytes, seeds=parse_seeds(args.seeds),
                       overrides=args.overrides, eval_data=args.eval_data, eval_docs=args.eval_docs,
                       eval_samples=args.eval_samples, eval_batch_size=args.eval_batch_size,
                       baseline=baseline, device=args.device)
    if args.dry_run:
        from ..run import is_finished

        runs = plan(spec)
        for r in runs:
            state = "finished" if is_finished(r.run_dir) else "to train"
            print(f"{r.variant.tag:28s} seed {r.seed:<4d} {r.cfg.method:10s} "
                  f"{r.cfg.train.total_bytes:>12,} bytes  {r.run_dir}  ({state})")
        print(f"{len(runs)} runs")
        return 0
    results = run_compare(spec, train_runs=not args.no_train, progress=not args.no_progress)
    print(method_table(results))
    print(f"\nwrote {spec.out / 'results.md'}, {spec.out / 'results.json'}, {spec.out / 'curves.png'}")
    return int(results.get("exit_code", 0))
