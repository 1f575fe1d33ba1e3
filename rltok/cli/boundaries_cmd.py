"""rltok boundaries"""

from __future__ import annotations

import sys
from pathlib import Path

from . import HelpFormatter, add_threads_arg, apply_threads, device_arg, positive_int, seed_arg


def register(sub) -> None:
    p = sub.add_parser(
        "boundaries", help="show a run's chunks on a text (terminal, HTML, PNG)",
        description="Run a model on a text and show where its chunks end: in the terminal the text "
                    "with a delimiter after each chunk; --html writes a self-contained page and --png "
                    "an image with each character shaded by its boundary probability. Texts longer than "
                    "the model's window are read in consecutive windows (each with BOS).",
        formatter_class=HelpFormatter)
    p.add_argument("run", help="run directory")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="the text (one that starts with '-': --text=TEXT)")
    src.add_argument("--file", help="read the text from a file (bytes as they are)")
    p.add_argument("--html", default=None, help="write a self-contained HTML page here")
    p.add_argument("--png", default=None, help="write a PNG here")
    p.add_argument("--max-bytes", type=positive_int, default=4096, help="show at most this many bytes of the text")
    p.add_argument("--greedy", action="store_true", help="greedy boundaries (probability > 0.5) instead of a sample")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed of the boundary sample")
    p.add_argument("--sep", default="|", help="chunk delimiter in the terminal")
    p.add_argument("--inner-sep", default="\u2016", help="two-stage models: the delimiter after a chunk that "
                                                          "also ends an inner (second-stage) chunk")
    p.add_argument("--device", type=device_arg, default="cpu", help="cpu or cuda")
    p.add_argument("--checkpoint", default=None, help="use a checkpoint instead of the final weights")
    add_threads_arg(p)
    p.set_defaults(func=run)


def run(args) -> int:
    apply_threads(args)
    import numpy as np

    from ..analysis import segment_docs
    from ..errors import RltokError
    from ..run import describe_weights, load_model
    from ..text import printable, to_bytes
    from ..viz import render_html, render_png, render_terminal

    if args.file is not None:
        try:
            with open(args.file, "rb") as f:
                data = f.read(args.max_bytes)  # not more: the file may be huge (or /dev/zero)
        except OSError as e:
            raise RltokError(f"{args.file}: cannot read: {e.strerror or e}") from None
    else:
        data = to_bytes(args.text)  # bytes are bytes: invalid UTF-8 in the argument is kept
    data = data[: args.max_bytes]
    if not data:
        raise RltokError("the text is empty")
    model = load_model(args.run, device=args.device, checkpoint=args.checkpoint)
    cfg = model.run_config
    pieces, res = segment_docs(model, [data], seed=args.seed, mode="greedy" if args.greedy else "sample",
                               dtype="fp32")
    if res[0].boundaries is None:
        raise RltokError(f"{args.run}: method {cfg.method!r} has no chunk boundaries")
    b = np.concatenate([r.boundaries for r in res])
    probs = np.concatenate([r.probs if r.probs is not None else r.boundaries.astype(float) for r in res])
    b[-1] = True
    n_chunks = int(b.sum())
    inner = None
    if res[0].inner_boundaries is not None:
        inner = np.concatenate([r.inner_boundaries for r in res])
        inner[-1] = True
    w = model.weights
    title = f"{Path(args.run).name} ({cfg.method}, {w['checkpoint']}{'' if w['finished'] else ', unfinished run'})"
    info = (f"{len(data)} bytes, {n_chunks} chunks, {len(data) / n_chunks:.2f} bytes/chunk"
            + ("" if inner is None else f", {int(inner.sum())} inner chunks ({args.inner_sep}), "
                                          f"{len(data) / int(inner.sum()):.2f} bytes/inner chunk")
            + f"; {'greedy' if args.greedy else f'sampled (seed {args.seed})'} boundaries; "
            f"weights {describe_weights(model)}")
    wrote = []
    if args.html:
        Path(args.html).parent.mkdir(parents=True, exist_ok=True)
        Path(args.html).write_text(render_html(data, b, probs, title, info, inner), encoding="utf-8")
        wrote.append(args.html)
    if args.png:
        render_png(data, b, probs, args.png, title=title, info=info)
        wrote.append(args.png)
    if wrote:
        print(f"{info}\nwrote {', '.join(wrote)}")
    else:
        sys.stdout.write(render_terminal(data, b, printable(args.sep), inner, printable(args.inner_sep)) + "\n")
        print(f"[{info}]", file=sys.stderr)
    return 0
