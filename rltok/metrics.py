"""A run's metrics file (RUN/metrics.jsonl): one JSON object per line, training steps and events.

Read by compare, its report and the training-curve charts; written by ``train.MetricsLog``.
"""

from __future__ import annotations

import json
from pathlib import Path

from .errors import RltokError

METRICS = "metrics.jsonl"


def read_metrics(run_dir: str | Path, missing_ok: bool = True) -> list[dict]:
    """The records of RUN/metrics.jsonl, in order; a line cut short by a crash is skipped. A run
    without the file gives [] (``missing_ok``) or a one-line error."""
    path = Path(run_dir) / METRICS
    if not path.is_file():
        if missing_ok:
            return []
        raise RltokError(f"{run_dir}: no {METRICS} (not a run, or not started)")
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
