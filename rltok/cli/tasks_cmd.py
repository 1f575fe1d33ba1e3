"""rltok tasks"""

from __future__ import annotations

import json
import sys

from . import HelpFormatter, add_threads_arg, apply_threads, device_arg, positive_int, seed_arg


def register(sub) -> None:
    p = sub.add_parser(
        "tasks", help="0-shot PIQA, HellaSwag, ARC-Easy, LAMBADA: target bits-per-byte and accuracy",
        description="Score a run on downstream tasks, 0-shot, with prompts formatted as "
                    "lm-evaluation-harness formats them. Per task: bits-per-byte of the gold "
                    "continuation given the context (mean ± standard error over items; the paper's "
                    "metric), accuracy (lowest total NLL) and acc_norm (lowest NLL per byte). The model "
                    "reads BOS + context + continuation, left-truncated to its window. Data: the files "
                    "`rltok data fetch-evals` stored, or the official files under --data-dir.",
        formatter_class=HelpFormatter)
    p.add_argument("run", help="run directory")
    p.add_argument("--tasks", default="piqa,hellaswag,arc_easy,lambada", help="comma-separated tasks")
    p.add_argument("--limit", type=positive_int, default=None, help="score the first N items of each task")
    p.add_argument("--samples", type=positive_int, default=1,
                   help="boundary samples per request (NLL averaged)")
    p.add_argument("--data-dir", default=None,
                   help="folder with the official files (piqa/, arc_easy/, lambada/, hellaswag/ as in "
                        "../shared/data); default: the files stored by `rltok data fetch-evals`")
    p.add_argument("--gold-only", action="store_true", help="score only the gold continuation (bpb, no accuracy)")
    p.add_argument("--no-generation", action="store_true", help="skip LAMBADA's greedy-decoding accuracy")
    p.add_argument("--greedy-boundaries", action="store_true",
                   help="boundaries with probability > 0.5 instead of sampled (the paper samples)")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed of the boundary samples")
    p.add_argument("--batch-size", type=positive_int, default=16, help="requests per forward pass")
    p.add_argument("--device", type=device_arg, default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default=None, help="default: the run's training dtype")
    p.add_argument("--checkpoint", default=None, help="score a checkpoint instead of the final weights")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--per-item", action="store_true", help="include per-item scores in the JSON")
    p.add_argument("--against", default=None, metavar="RUN2",
                   help="also score RUN2 on the same items with the same boundary draws, and report the "
                        "paired per-item difference of bits-per-byte (RUN - RUN2, mean ± SE)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_threads_arg(p)
    p.set_defaults(func=run)


def run(args) -> int:
    apply_threads(args)
    from ..errors import RltokError
    from ..run import describe_weights, load_model
    from ..tasks import evaluate_tasks, load_task
    from ..tasks.evaluate import format_table
    from ..tasks.formats import canonical_task

    names = [canonical_task(t) for t in args.tasks.split(",") if t.strip()]
    if not names:
        raise RltokError("--tasks: name at least one task")
    model = load_model(args.run, device=args.device, checkpoint=args.checkpoint)  # a bad run fails first
    data = {t: load_task(t, args.data_dir, args.limit) for t in dict.fromkeys(names)}

    def score(model):  # the same items, settings and boundary draws for RUN and RUN2
        return evaluate_tasks(model, data, samples=args.samples, seed=args.seed,
                              mode="greedy" if args.greedy_boundaries else "sample",
                              batch_size=args.batch_size, dtype=args.dtype or model.run_config.train.dtype,
                              gold_only=args.gold_only, generation=not args.no_generation,
                              progress=not args.no_progress)  # tqdm writes to stderr, JSON to stdout

    cfg = model.run_config
    weights, weights_line = model.weights, describe_weights(model)
    results = score(model)
    seq_len = cfg.model.seq_len
    against = None
    if args.against is not None:
        from ..evaluate import paired_difference

        del model  # one model in memory at a time
        model2 = load_model(args.against, device=args.device)
        others = score(model2)
        against = {"run": str(args.against), "method": model2.run_config.method, **model2.weights, "tasks": {}}
        for r, o in zip(results, others):
            d = o.to_dict(per_item=args.per_item)
            d["paired"] = paired_difference([x["bpb"] for x in r.per_item], [x["bpb"] for x in o.per_item])
            against["tasks"][r.task] = d
    if args.json:
        out = {"run": str(args.run), "method": cfg.method, **weights, "seq_len": seq_len,
               "samples": args.samples, "seed": args.seed,
               "boundaries": "greedy" if args.greedy_boundaries else "sample",
               "tasks": {r.task: r.to_dict(per_item=args.per_item) for r in results}}
        if against is not None:
            out["against"] = against
        print(json.dumps(out))
        return 0
    print(f"{args.run} ({cfg.method}), 0-shot, {args.samples} boundary sample(s), seed {args.seed}, "
          f"window {seq_len} bytes; weights {weights_line}")
    print(format_table(results))
    for r in results:
        print(f"  {r.task}: {r.source}")
        if r.truncated:
            print(f"  {r.task}: {r.truncated} of {r.items} contexts were longer than the model's window "
                  f"and were left-truncated to {seq_len} bytes (BOS included)")
        if isinstance(r.greedy_acc, str):
            print(f"  {r.task}: greedy-decoding accuracy {r.greedy_acc}")
    if against is not None:
        print(f"\nagainst {args.against} ({against['method']}): bits/byte of {args.run} minus {args.against}, "
              f"paired over the same items")
        for name, d in against["tasks"].items():
            pd = d["paired"]
            print(f"  {name:<10} {d['bpb']:.4f} ± {d['bpb_se']:.4f}   difference {pd['diff']:+.4f} ± {pd['se']:.4f} "
                  f"(z = {pd['z']:+.1f}, {pd['n']} items)")
    if any(r.task == "lambada" for r in results):
        print("  lambada acc: every byte of the target word is the argmax (lm-eval's lambada_openai acc)")
    sys.stdout.flush()
    return 0
