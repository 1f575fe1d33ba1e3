"""Data-parallel training on CPU with real torch.distributed (gloo), two processes under torchrun.

Two launches for the whole module (each costs a few seconds of process start-up):

* the user's command, ``torchrun --nproc_per_node=2 -m rltok train ...`` (``rl``, DDP);
* ``tests/dist_worker.py`` running several jobs in one process group: ``uniform`` and an STE
  baseline (``nawrot``, when registered) under DDP, ``rl`` under FSDP2, DDP with gradient
  accumulation, and a run stopped at step 3 (then resumed under FSDP).

Each is compared with one process on the same global batch. The per-rank REINFORCE baseline
over a micro-batch of G/2 sequences is the one-process baseline with ``boundary.baseline_group
= G/2``; the rate penalty's detached mean is averaged across ranks, which equals the
one-process mean because stream packing gives every sequence the same number of bytes.
Tolerance: fp32, weights within 1e-5 (observed <= 1.5e-7 after two and six steps, while a
one-process run with the baseline over all G sequences instead differs by 3e-3), losses within
1e-5 relative.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rltok.methods import method_names
from rltok.checkpoint import load_tensors
from rltok.config import build_config
from rltok.data.prepare import PrepareOptions, prepare
from rltok.train import train

REPO = Path(__file__).resolve().parents[1]
G = 4  # global batch (sequences)
BASE = {"train.eval_docs": 0, "train.log_every": 1, "train.max_steps": 2, "train.batch_size": G,
        "train.dtype": "fp32", "train.device": "cpu"}
RL = {"boundary.baseline_group": G // 2}
TWO_STAGE = {"model.stages": 2, "boundary.rate_integral_gain": 1.0}
WEIGHT_ATOL = 1e-5


def _corpus_docs() -> list[str]:
    import json as _json
    import textwrap
    import unittest

    texts = []
    for mod in (_json, textwrap, unittest, os, torch.nn.functional, subprocess, shutil):
        for para in (mod.__doc__ or "").strip().split("\n\n"):
            if len(para) > 40:
                texts.append(para)
    return texts


def _env() -> dict:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    return env


def _torchrun(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args]
    r = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"torchrun failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return r


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """Prepare a real-text corpus into shards, then run the two torchrun launches."""
    root = tmp_path_factory.mktemp("dist")
    src = root / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in _corpus_docs()))
    prep = root / "prep"
    prepare(PrepareOptions(str(src), str(prep), min_bytes=1, val_docs=4), progress=False)
    data = {"data.source": str(prep)}

    cli = root / "cli_rl"
    args = ["-m", "rltok", "train", "--method", "rl", "--preset", "smoke", "--out", str(cli), "--no-progress"]
    for k, v in {**BASE, **RL, **data, "train.eval_docs": 2}.items():
        args += ["--set", f"{k}={v}"]
    cli_run = _torchrun(args, root)

    stop_over = {**BASE, **RL, **data, "train.max_steps": 6, "train.ckpt_every": 3}
    jobs = [
        {"name": "uniform", "method": "uniform", "overrides": {**BASE, **data}, "out": str(root / "uniform")},
        {"name": "fsdp", "method": "rl",
         "overrides": {**BASE, **RL, **data, "train.parallel": "fsdp", "train.eval_docs": 2},
         "out": str(root / "fsdp")},
        {"name": "accum", "method": "rl",
         "overrides": {**BASE, **data, "train.batch_size": 8, "train.micro_batch": 2,
                       "boundary.baseline_group": 2, "boundary.rate_weight": 0.0},
         "out": str(root / "accum")},
        {"name": "stop", "method": "rl", "overrides": stop_over, "out": str(root / "stop"), "stop_at_step": 3},
        {"name": "fsdp_resume", "method": "rl", "overrides": {**stop_over, "train.parallel": "fsdp"},
         "out": str(root / "fsdp_resume"), "copy_from": str(root / "stop"), "resume": True},
    ]
    # two stages, with the integral rate controller: both levels' baselines and the controller's
    # rate are reduced across ranks like the one-stage estimator's
    jobs.append({"name": "two_stage", "method": "rl", "out": str(root / "two_stage"),
                 "overrides": {**BASE, **RL, **data, **TWO_STAGE}})
    if "nawrot" in method_names():
        jobs.append({"name": "nawrot", "method": "nawrot", "overrides": {**BASE, **data},
                     "out": str(root / "nawrot")})
    (root / "jobs.json").write_text(json.dumps(jobs))
    _torchrun([str(REPO / "tests" / "dist_worker.py"), str(root / "jobs.json"), str(root / "results.json")], root)
    results = json.loads((root / "results.json").read_text())
    return {"root": root, "data": data, "results": results, "cli": cli, "cli_stdout": cli_run.stdout}


def _steps(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "event" not in r]


def _compare(run_a: Path, run_b: Path, atol: float = WEIGHT_ATOL) -> float:
    a, b = load_tensors(run_a / "model.safetensors"), load_tensors(run_b / "model.safetensors")
    assert a.keys() == b.keys()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst < atol, f"weights differ by {worst:.3g} (tolerance {atol})"
    return worst


def _reference(dist, name: str, method: str, overrides: dict) -> Path:
    out = dist["root"] / f"ref_{name}"
    if not out.exists():
        train(build_config(method, "smoke", overrides={**overrides, **dist["data"]}), out, progress=False)
    return out


@pytest.mark.parametrize("method", ["rl", "nawrot", "uniform"])
def test_two_ranks_equal_one_process(dist, method):
    if method not in method_names():
        pytest.skip(f"method {method!r} is not registered in this build")
    if method == "rl":
        run = dist["cli"]  # launched with the user's command
        ref = _reference(dist, "rl", "rl", {**BASE, **RL, "train.eval_docs": 2})
    else:
        assert dist["results"][method] == {"exit_code": 0, "steps": 2}
        run = dist["root"] / method
        ref = _reference(dist, method, method, BASE)
    sa, sb = _steps(run), _steps(ref)
    assert [r["step"] for r in sa] == [1, 2]
    for ra, rb in zip(sa, sb):
        for key in ("loss", "lm_loss", "bpb", "rate"):
            assert ra[key] == pytest.approx(rb[key], rel=1e-5), key
    _compare(run, ref)


def test_two_ranks_equal_one_process_for_two_stages(dist):
    assert dist["results"]["two_stage"] == {"exit_code": 0, "steps": 2}
    run = dist["root"] / "two_stage"
    ref = _reference(dist, "two_stage", "rl", {**BASE, **RL, **TWO_STAGE})
    for ra, rb in zip(_steps(run), _steps(ref)):
        for key in ("loss", "bpb", "rate", "inner_rate"):
            assert ra[key] == pytest.approx(rb[key], rel=1e-5), key
    _compare(run, ref)


def test_torchrun_cli_writes_once_and_shuts_down(dist):
    run = dist["cli"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["finished"] and summary["world_size"] == 2 and summary["steps"] == 2
    assert summary["val_docs"] == 2  # evaluated once, on rank 0
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == len({line for line in lines})  # only rank 0 writes: no duplicated lines
    assert sum('"final_eval"' in line for line in lines) == 1
    assert dist["cli_stdout"].count("done: ") == 1


def test_fsdp_equals_one_process(dist):
    assert dist["results"]["fsdp"] == {"exit_code": 0, "steps": 2}
    ref = _reference(dist, "rl", "rl", {**BASE, **RL, "train.eval_docs": 2})
    _compare(dist["root"] / "fsdp", ref)
    # evaluation with sharded weights runs on every rank (each forward gathers), logged once
    s_fsdp = json.loads((dist["root"] / "fsdp" / "summary.json").read_text())
    s_ref = json.loads((ref / "summary.json").read_text())
    assert s_fsdp["val_docs"] == 2 and s_fsdp["val_bpb"] == pytest.approx(s_ref["val_bpb"], rel=1e-4)


def test_accumulation_across_ranks_equals_one_process(dist):
    """2 ranks x 2 micro-steps of 2 sequences (no gradient sync on the first) == one process
    with the batch of 8 (rate penalty off: its per-micro-step mean is not additive)."""
    assert dist["results"]["accum"] == {"exit_code": 0, "steps": 2}
    ref = _reference(dist, "accum", "rl", {**BASE, "train.batch_size": 8, "boundary.baseline_group": 2,
                                           "boundary.rate_weight": 0.0})
    _compare(dist["root"] / "accum", ref)


def test_resume_at_a_different_world_size(dist):
    """Stopped at step 3 of 6 with 2 processes; resumed with 1 process (DDP checkpoint) and with
    2 processes under FSDP: both end where one process trained straight through ends."""
    assert dist["results"]["stop"] == {"exit_code": 130, "steps": 3}
    assert dist["results"]["fsdp_resume"] == {"exit_code": 0, "steps": 6}
    over = {**BASE, **RL, "train.max_steps": 6, "train.ckpt_every": 3}
    straight = _reference(dist, "straight6", "rl", over)
    one = dist["root"] / "resumed_one_process"
    shutil.copytree(dist["root"] / "stop", one)
    res = train(build_config("rl", "smoke", overrides={**over, **dist["data"]}), one, resume=True, progress=False)
    assert res.steps == 6 and res.summary["world_size"] == 1
    _compare(one, straight)
    _compare(dist["root"] / "fsdp_resume", straight)
    # the log has each step once, the first three from the 2-process part
    assert [r["step"] for r in _steps(one)] == [1, 2, 3, 4, 5, 6]
