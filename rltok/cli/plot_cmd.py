"""rltok plot"""

from __future__ import annotations

from . import HelpFormatter


def register(sub) -> None:
    p = sub.add_parser(
        "plot", help="training curves of runs (PNG)",
        description="Plot training curves from each run's metrics.jsonl against bytes seen: "
                    "bits-per-byte (train, validation), boundary rate, whitespace recall and the "
                    "estimator's statistics (policy entropy, advantage and return spread, "
                    "policy-gradient loss), where the runs logged them.",
        formatter_class=HelpFormatter)
    p.add_argument("runs", nargs="+", help="run directories")
    p.add_argument("--out", required=True, help="PNG to write")
    p.add_argument("--labels", default=None, help="comma-separated legend labels (default: directory names)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..errors import RltokError
    from ..viz import plot_curves

    labels = args.labels.split(",") if args.labels else None
    if labels and len(labels) != len(args.runs):
        raise RltokError(f"--labels has {len(labels)} names for {len(args.runs)} runs")
    out = plot_curves(args.runs, args.out, labels)
    print(f"wrote {out}")
    return 0
