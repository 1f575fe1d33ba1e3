"""rltok generate"""

from __future__ import annotations

import json
import sys

from . import HelpFormatter, device_arg, nonneg_int, seed_arg


def register(sub) -> None:
    p = sub.add_parser(
        "generate", help="sample text from a trained run (KV-cached, batched)",
        description="Continue one or more prompts with a trained run, one byte at a time from KV "
                    "caches; the boundary method decides chunk ends as it goes. With a single prompt "
                    "the text is printed as it is produced. Invalid UTF-8 is shown as U+FFFD.",
        formatter_class=HelpFormatter)
    p.add_argument("run", help="run directory")
    p.add_argument("--prompt", action="append", default=None,
                   help="prompt text; repeat for a batch; '-' reads one prompt from stdin (default: empty)")
    p.add_argument("--max-bytes", type=nonneg_int, default=256, help="new bytes per prompt at most")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature; 0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    p.add_argument("--top-k", type=nonneg_int, default=0, help="sample among the k most likely bytes (0 = off)")
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable); removed from the output")
    p.add_argument("--rate", type=float, default=None,
                   help="run a rate-conditioned model at this boundary rate (default: its target rate)")
    p.add_argument("--seed", type=seed_arg, default=None, help="seed of bytes and boundaries (default: fresh, printed)")
    p.add_argument("--greedy-boundaries", action="store_true",
                   help="boundary where its probability > 0.5 instead of sampling")
    p.add_argument("--no-cache", action="store_true",
                   help="re-run the full model for every byte (slow reference; works for every method)")
    p.add_argument("--show-boundaries", action="store_true",
                   help="also print prompt and continuation cut into the decoded chunks, separated by |")
    p.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    p.add_argument("--device", type=device_arg, default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default=None,
                   help="compute precision (default: the run's training dtype; auto = the faster here)")
    p.add_argument("--threads", type=nonneg_int, default=0,
                   help="CPU threads (0 = the available cores less those busy with other work); 1 is often fastest for one byte at a time")
    p.add_argument("--checkpoint", default=None, help="use a checkpoint (e.g. step_00000100) instead of the final weights")
    p.set_defaults(func=run)


def _prompts(args) -> list[str]:
    prompts = args.prompt or [""]
    if prompts.count("-") > 1:
        from ..errors import RltokError

        raise RltokError("--prompt -: stdin can supply only one prompt")
    # stdin as bytes: a prompt need not be valid UTF-8
    return [sys.stdin.buffer.read() if x == "-" else x for x in prompts]


def run(args) -> int:
    from ..generate import _check_args, generate
    from ..run import describe_weights, load_model
    from ..text import printable, to_bytes

    prompts = _prompts(args)
    from . import apply_threads

    apply_threads(args)
    model = load_model(args.run, device=args.device, checkpoint=args.checkpoint)
    if not model.weights["finished"] or args.checkpoint:
        # stderr, so that piped text stays the generated text alone
        print(f"rltok: generating with {describe_weights(model)}", file=sys.stderr)
    out = sys.stdout
    streaming = len(prompts) == 1 and not args.json

    def stream(_i: int, text: str) -> None:
        out.write(text)
        out.flush()

    stops = [to_bytes(s) for s in args.stop or []]
    _check_args(args.max_bytes, args.temperature, args.top_p, args.top_k, "sample", stops)  # before printing
    from ..rates import check_rate, requested_rate

    if args.rate is not None:
        check_rate(model, args.rate)
    if streaming:
        out.write(printable(prompts[0]))
        out.flush()
    with requested_rate(model, args.rate):
        res = generate(model, prompts, args.max_bytes, temperature=args.temperature, top_p=args.top_p,
                       top_k=args.top_k, boundary_mode="greedy" if args.greedy_boundaries else "sample",
                       stop=stops, seed=args.seed, stream=stream if streaming else None,
                       cache=not args.no_cache, dtype=args.dtype or model.run_config.train.dtype)
    for i, g in enumerate(res):
        chunks = [c.decode("utf-8", errors="replace") for c in g.chunks()]
        if args.json:
            d = {"index": i, "prompt": g.prompt.decode("utf-8", errors="replace"), "text": g.text,
                 "stop_reason": g.stop_reason, "new_bytes": len(g.output), "seed": res.seed,
                 "mean_logprob": float(g.logprobs.mean()) if len(g.logprobs) else None}
            if args.show_boundaries:
                d["chunks"] = chunks
            out.write(json.dumps(d) + "\n")
            continue
        if streaming:
            out.write("\n")
        else:
            out.write(f"--- [{i}] ({g.stop_reason})\n{g.prompt.decode('utf-8', errors='replace')}{g.text}\n")
        if args.show_boundaries:
            out.write("chunks: " + "|".join(chunks) + "\n")
    n = sum(len(g.sampled) for g in res)
    speed = f"{res.bytes_per_s:,.0f} bytes/s" if res.decode_bytes else "n/a"
    print(f"[{n} bytes for {len(res)} prompt(s); first byte {res.ttfb_s * 1e3:.1f} ms; {speed}; "
          f"{'cached' if res.cached else 'no cache'}; seed {res.seed}]", file=sys.stderr)
    return 0
