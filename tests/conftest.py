"""Shared fixtures. Tests that read ../shared/data skip cleanly when it is absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(min(2, os.cpu_count() or 1))
# train.dtype=auto picks the faster of bf16 and fp32 on the CPU at hand (rltok/precision.py);
# the suite's numbers must not depend on which CPU CI gets, so auto means fp32 here (also in the
# CLI subprocesses, which inherit it). tests/test_precision.py lifts the pin and fakes the probe.
os.environ.setdefault("RLTOK_CPU_DTYPE", "fp32")

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RLTOK_SHARED", REPO.parent / "shared"))
SHARED_DATA = SHARED / "data"
C4 = SHARED_DATA / "webtext" / "c4" / "c4_sample.jsonl"


def shared_file(*parts: str) -> Path:
    p = SHARED_DATA.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"shared data not available: {p}")
    return p


@pytest.fixture
def c4_path() -> Path:
    return shared_file("webtext", "c4", "c4_sample.jsonl")


@pytest.fixture
def small_corpus_file(tmp_path) -> Path:
    """A real-text corpus independent of ../shared: paragraphs of this repository's README and
    the Python standard library's docstrings are real English."""
    import json
    import textwrap
    import unittest

    texts = []
    for mod in (json, textwrap, unittest, os, torch.nn.functional):
        doc = (mod.__doc__ or "").strip()
        for para in doc.split("\n\n"):
            if len(para) > 40:
                texts.append(para)
    path = tmp_path / "docs.jsonl"
    with open(path, "w") as f:
        for t in texts * 3:
            f.write(json.dumps({"text": t}) + "\n")
    return path


def _docstring_texts() -> list[str]:
    import json as _json
    import textwrap
    import unittest

    texts = []
    for mod in (_json, textwrap, unittest, os, torch.nn.functional):
        for para in (mod.__doc__ or "").strip().split("\n\n"):
            if len(para) > 40:
                texts.append(para)
    return texts


@pytest.fixture(scope="session")
def smoke_runs(tmp_path_factory) -> dict[str, Path]:
    """Trained smoke-size runs {"rl": dir, "uniform": dir} on real English (docstrings), shared
    by the evaluation, analysis and visualisation tests (a few seconds each)."""
    import json as _json

    from rltok.config import build_config
    from rltok.train import train

    tmp = tmp_path_factory.mktemp("smoke_runs")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is faster, and immune to a busy machine
    data = tmp / "docs.jsonl"
    data.write_text("".join(_json.dumps({"text": t}) + "\n" for t in _docstring_texts() * 2))
    runs = {}
    for method in ("rl", "uniform"):
        cfg = build_config(method, "smoke", overrides={"data.source": str(data), "train.eval_docs": 2,
                                                             "train.max_steps": 8})
        train(cfg, tmp / method, progress=False)
        runs[method] = tmp / method
    torch.set_num_threads(threads)
    return runs


@pytest.fixture
def one_thread():
    """Run a test on one torch thread (smoke-size models gain nothing from more, and threads
    oversubscribed on a shared machine slow them down many times)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
