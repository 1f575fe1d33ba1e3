"""rltok plan"""

from __future__ import annotations

import json

from . import HelpFormatter, positive_int


def register(sub) -> None:
    from ..presets import GPUS, PRESETS, RECIPES

    p = sub.add_parser(
        "plan", help="memory per GPU and run time of a recipe, before renting GPUs",
        description="Predict a run's peak memory per GPU (parameters, gradients and AdamW state, "
                    "sharded by FSDP2 across GPUs; bf16 weight copies; the activations the backward "
                    "keeps, counted by tracing the real forward on the meta device) and its time on "
                    "N GPUs at 35%% and 45%% MFU (rltok/plan.py; docs/scaling.md).",
        formatter_class=HelpFormatter)
    p.add_argument("--recipe", default="", help=f"a recipe: {', '.join(RECIPES)}")
    p.add_argument("--preset", default=None, help=f"model size: {', '.join(PRESETS)} (default: the recipe's)")
    p.add_argument("--method", default=None, help="boundary method (default: the recipe's, else rl)")
    p.add_argument("--gpus", type=positive_int, default=8, help="GPUs")
    p.add_argument("--gpu", default="h100", choices=[*GPUS, "all"], help="GPU kind")
    p.add_argument("--micro-batch", type=positive_int, default=None, help="sequences per micro-batch (default: the preset's)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override any config field, as in `rltok train`")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..plan import format_plan, plan
    from ..schema import _split_kv

    over = dict(_split_kv(s) for s in args.overrides)
    p = plan(args.method, args.preset, recipe=args.recipe, gpus=args.gpus, gpu=args.gpu, overrides=over,
             micro_batch=args.micro_batch)
    print(json.dumps(p, indent=2) if args.json else format_plan(p))
    return 0
