"""A run's metrics file (RUN/metrics.jsonl): one JSON object per line, training steps and events.

Written by :class:`MetricsLog` (training, and its optional TensorBoard / W&B mirrors); read by
compare, its report and the training-curve charts (:func:`read_metrics`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


class MetricsLog:
    """RUN/metrics.jsonl, the record of a run; with ``train.log_to`` the same numbers also go to
    TensorBoard (RUN/tensorboard/, through ``torch.utils.tensorboard``) and Weights & Biases
    (``wandb``, files under RUN/wandb/), tagged ``train/<key>`` or ``<event>/<key>``."""

    def __init__(self, path: Path, enabled: bool):
        self.path, self.enabled = path, enabled
        self.sinks: list[Any] = []

    def open_sinks(self, cfg, resume: bool) -> None:
        """Start the optional loggers (after the run directory exists and the resume point is known)."""
        targets = [x.strip() for x in cfg.train.log_to.split(",") if x.strip()]
        if not self.enabled or not targets:
            return
        run_dir = self.path.parent
        if "tensorboard" in targets:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise RltokError("train.log_to=tensorboard needs the tensorboard package "
                                 "(pip install tensorboard, or pip install 'rltok[logging]')") from None
            self.sinks.append(_TensorBoardSink(SummaryWriter(log_dir=str(run_dir / "tensorboard"))))
        if "wandb" in targets:
            try:
                import wandb
            except ImportError:
                raise RltokError("train.log_to=wandb needs the wandb package (pip install wandb, or "
                                 "pip install 'rltok[logging]'); WANDB_MODE=offline logs without an account") from None
            # one W&B run per rltok run, continued on --resume (its id is derived from the directory)
            import hashlib

            run_id = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:16]
            self.sinks.append(_WandbSink(wandb.init(project=cfg.train.wandb_project, name=run_dir.name,
                                                    id=run_id, dir=str(run_dir), config=cfg.to_dict(),
                                                    resume="allow" if resume else None)))

    def close(self) -> None:
        for s in self.sinks:
            s.close()
        self.sinks = []

    def truncate_after(self, step: int) -> None:
        """On resume: drop lines logged after the checkpoint we resume from, a line cut by a
        crash, and a final evaluation (the resumed run repeats it)."""
        if not (self.enabled and self.path.exists()):
            return
        from .checkpoint import write_bytes_atomic  # (torch: not at import, readers of metrics need none)

        keep = []
        for line in self.path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut by a crash
            at = rec.get("step", 0) if isinstance(rec, dict) else None
            if isinstance(at, (int, float)) and at <= step and rec.get("event") != "final_eval":
                keep.append(line)
        write_bytes_atomic(self.path, ("\n".join(keep) + "\n").encode() if keep else b"")

    def write(self, record: dict[str, Any]) -> None:
        if self.enabled:
            try:
                with open(self.path, "a") as f:
                    f.write(json.dumps(record, allow_nan=True) + "\n")
            except OSError as e:
                raise RltokError(f"cannot write {self.path}: {e.strerror or e}") from None
            if self.sinks and isinstance(record.get("step"), int):
                group = record.get("event", "train")
                scalars = {f"{group}/{k}": float(v) for k, v in record.items()
                           if k not in ("step", "event") and isinstance(v, (int, float)) and not isinstance(v, bool)}
                for s in self.sinks:
                    s.log(scalars, record["step"])


class _TensorBoardSink:
    def __init__(self, writer):
        self.writer = writer

    def log(self, scalars: dict[str, float], step: int) -> None:
        for k, v in scalars.items():
            self.writer.add_scalar(k, v, global_step=step)

    def close(self) -> None:
        self.writer.close()


class _WandbSink:
    def __init__(self, run):
        self.run = run

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()
