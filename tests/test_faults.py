"""Runs that survive: faults injected into real training processes and their files.

* kill and resume: SIGKILL at random moments and inside a checkpoint write (``rl`` and ``uniform``;
  2 processes under torchrun in the slow set), resumed with ``--resume``: the final weights are
  bit-identical to an uninterrupted run (tests/faults.py tallies faults and data lost);
* checkpoints: truncated, corrupted, pickled or mis-shaped files are refused with one line, and
  ``--resume`` falls back to the newest valid checkpoint, saying so; keep-last-K; no pickle on any
  load path (an AST scan of the package);
* numerical faults: NaN loss and infinite gradients are skipped, logged with step and data position;
  N in a row stop the run (exit 3) with a valid last checkpoint;
* disk full and read-only output: a failing writer, and a real tiny tmpfs where mounting one is
  possible: a one-line error, the previous checkpoint intact, no temporary files left;
* signals: SIGINT/SIGTERM write a final checkpoint (exit 130/143); a second SIGINT aborts at once.

The counts of the default run are small; ``pytest -m slow tests/test_faults.py -s`` runs the long
kill loops and prints the tally (set RLTOK_FAULT_TALLY=FILE to accumulate it in a JSON file).
"""

from __future__ import annotations

import ast
import errno
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rltok.checkpoint import (CheckpointError, latest_valid_checkpoint, list_checkpoints, load_checkpoint,
                              load_tensors, verify_checkpoint)
from rltok.cli import main
from rltok.config import build_config
from rltok.train import train

sys.path.insert(0, str(Path(__file__).resolve().parent))
import faults  # noqa: E402

from conftest import _docstring_texts  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STEPS = 40


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fault_data") / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in _docstring_texts() * 2))
    return path


def _cfg(data: Path, method: str = "rl", steps: int = STEPS, **over):
    return build_config(method, "smoke", overrides={
        "data.source": str(data), "train.max_steps": steps, "train.ckpt_every": 1, "train.eval_docs": 0,
        "train.keep_checkpoints": 2, **over})


def _reference(root: Path, data: Path, method: str, steps: int = STEPS, keep: int = 2) -> Path:
    """An uninterrupted run, in this process on one thread (bit-identical to the CLI's
    ``--threads 1`` run)."""
    out = root / f"ref_{method}_{steps}"
    if not (out / "model.safetensors").exists():
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            train(_cfg(data, method, steps, **{"train.keep_checkpoints": keep, "train.ckpt_every": 10}), out,
                  progress=False)  # how often it saves does not change the weights
        finally:
            torch.set_num_threads(threads)
    return out


def _assert_identical(a: Path, b: Path) -> None:
    wa, wb = load_tensors(a / "model.safetensors"), load_tensors(b / "model.safetensors")
    assert wa.keys() == wb.keys()
    differ = [k for k in wa if not torch.equal(wa[k], wb[k])]
    assert not differ, f"{len(differ)} tensors differ, e.g. {differ[0]}"


def _finish_tally(tally: faults.Tally) -> None:
    print("\n" + tally.report())
    if os.environ.get("RLTOK_FAULT_TALLY"):
        tally.save(Path(os.environ["RLTOK_FAULT_TALLY"]))
    assert sum(tally.lost.values()) == 0, tally.report()


def _one_line_error(err: str) -> str:
    lines = [x for x in err.strip().splitlines() if x.strip() and not x.startswith("rltok: ")]
    assert lines and lines[-1].startswith("error: "), err
    assert "Traceback" not in err, err
    assert len(lines) == 1, err
    return lines[-1]


def _stray_temporaries(run: Path) -> list[Path]:
    return list((run / "checkpoints").glob(".*")) + list(run.glob(".*.tmp-*"))


# -- 1. kill and resume ------------------------------------------------------------------------------

@pytest.mark.parametrize("method,kills", [
    ("rl", ["sigkill-random", "sigint", "sigkill-in-checkpoint"]),
    ("uniform", ["sigterm", "sigkill-in-checkpoint"]),
])
def test_sigkill_then_resume_is_bit_identical(tmp_path, data, method, kills):
    tally = faults.Tally()
    ref = _reference(tmp_path, data, method)
    run = tmp_path / "run"
    # faults within half a second of a new checkpoint: each lands early enough to leave steps
    # for the next one, also on a fast machine
    faults.kill_chain(run, data, method, STEPS, kills, random.Random(7), tally, max_delay=0.5)
    assert sum(tally.injected.values()) == len(kills), tally.report()
    _assert_identical(ref, run)
    assert not _stray_temporaries(run)
    _finish_tally(tally)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["rl", "uniform"])
def test_kill_loop_many(tmp_path, data, method):
    """Five runs, each stopped four times: SIGKILL at a random moment, SIGKILL inside a checkpoint
    write, SIGINT and SIGTERM, in a random order."""
    tally = faults.Tally()
    ref = _reference(tmp_path, data, method, 80)
    rng = random.Random(2026)
    for i in range(5):
        kinds = rng.sample(["sigkill-random", "sigkill-in-checkpoint", "sigint", "sigterm"], 4)
        run = tmp_path / f"run{i}"
        faults.kill_chain(run, data, method, 80, kinds, rng, tally)
        _assert_identical(ref, run)
    _finish_tally(tally)


@pytest.mark.slow
def test_torchrun_kill_loop(tmp_path, data):
    """Two processes under torchrun: SIGKILL of one worker (torchrun tears the other down), of the
    agent alone (the orphaned workers notice, checkpoint and exit), of everything at random moments
    and inside a checkpoint write; the resumed run equals an uninterrupted 2-process run bit for bit."""
    tally = faults.Tally()
    ref = tmp_path / "ref"
    p = faults.Proc(faults.train_argv(ref, data, "rl", 60, torchrun=True), tmp_path)
    assert p.wait() == 0, p.stderr[-3000:]
    rng = random.Random(11)
    for i, kinds in enumerate([["sigkill-one-worker", "sigkill-agent", "sigkill-in-checkpoint", "sigterm"],
                               ["sigkill-random", "sigkill-agent", "sigint", "sigkill-one-worker"]]):
        run = tmp_path / f"run{i}"
        faults.kill_chain(run, data, "rl", 60, kinds, rng, tally, torchrun=True)
        _assert_identical(ref, run)
    _finish_tally(tally)


def test_second_trainer_of_a_run_is_refused(tmp_path, data, capsys):
    """A run being trained is locked: a second `rltok train --resume` of it is refused (e.g. a
    requeued job while the old one still runs, or workers orphaned by a killed torchrun agent)."""
    from rltok.run import RunLock

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(_cfg(data).to_json())
    lock = RunLock(run).acquire()
    try:
        code = main(["train", "--out", str(run), "--resume", "--preset", "smoke", "--no-progress"])
        err = capsys.readouterr().err
        assert code == 2 and "being trained by another process" in _one_line_error(err)
        assert f"pid {os.getpid()}" in err
    finally:
        lock.release()
    RunLock(run).acquire().release()  # released: free again


# -- 2. checkpoints ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory, data) -> Path:
    """A run stopped at step 6 of 12 with checkpoints at steps 4, 5, 6 (keep 3)."""
    root = tmp_path_factory.mktemp("stopped")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(_cfg(data, steps=12, **{"train.keep_checkpoints": 3}), root / "run", progress=False, stop_at_step=6)
    finally:
        torch.set_num_threads(threads)
    return root / "run"


@pytest.fixture
def run_copy(stopped_run, tmp_path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(stopped_run, dst)
    return dst


def test_keep_last_k_and_atomic_layout(stopped_run):
    names = [p.name for p in list_checkpoints(stopped_run)]
    assert names == ["step_00000004", "step_00000005", "step_00000006"]
    for p in list_checkpoints(stopped_run):
        m = verify_checkpoint(p)
        assert set(m["files"]) == {"model.safetensors", "optim.safetensors", "state.json"}
        for name, info in m["files"].items():
            assert (p / name).stat().st_size == info["size"] and len(info["sha256"]) == 64
    assert not _stray_temporaries(stopped_run)


@pytest.mark.parametrize("damage", ["truncate", "flip", "no-manifest", "bad-manifest", "empty-state"])
def test_damaged_checkpoint_is_detected(run_copy, damage):
    ck = list_checkpoints(run_copy)[-1]
    f = ck / "model.safetensors"
    if damage == "truncate":
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
        needle = "truncated"
    elif damage == "flip":
        b = bytearray(f.read_bytes())
        b[len(b) // 2] ^= 0xFF
        f.write_bytes(bytes(b))
        needle = "corrupted"
    elif damage == "no-manifest":
        (ck / "manifest.json").unlink()
        needle = "incomplete checkpoint"
    elif damage == "bad-manifest":
        (ck / "manifest.json").write_text('{"format": "rltok-checkpoint-v1", "files": [1, 2]}')
        needle = "not an rltok checkpoint manifest"
    else:  # state.json replaced by something that is valid JSON of the wrong shape, manifest updated
        (ck / "state.json").write_text("[]")
        _rewrite_manifest(ck)
        needle = "not a JSON object"
    with pytest.raises(CheckpointError, match=needle):
        load_checkpoint(ck)
    if damage != "empty-state":
        assert latest_valid_checkpoint(run_copy, warn=lambda m: None).name == "step_00000005"


def test_resume_falls_back_to_newest_valid_checkpoint(run_copy, data, capsys, one_thread):
    """The two newest checkpoints are damaged: --resume says so and continues from step 4; the
    finished run equals one trained straight through."""
    for ck in list_checkpoints(run_copy)[-2:]:
        f = ck / "optim.safetensors"
        f.write_bytes(f.read_bytes()[:100])
    code = main(["train", "--out", str(run_copy), "--resume", "--preset", "smoke", "--steps", "12",
                 "--no-progress", "--threads", "1"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert err.count("skipping damaged checkpoint") == 2 and "step_00000006" in err
    assert "resuming" in err and "from step_00000004 (step 4," in err
    straight = run_copy.parent / "straight"
    train(_cfg(data, steps=12, **{"train.keep_checkpoints": 3}), straight, progress=False)
    _assert_identical(straight, run_copy)


class _Payload:
    """Pickling this object records a call that writes a marker file when unpickled."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "pwned"))


def _rewrite_manifest(ck: Path) -> None:
    """Recompute the manifest as an attacker who can write every file would."""
    from rltok.checkpoint import sha256_file

    m = json.loads((ck / "manifest.json").read_text())
    for name in m["files"]:
        m["files"][name] = {"size": (ck / name).stat().st_size, "sha256": sha256_file(ck / name)}
    (ck / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize("victim", ["model.safetensors", "optim.safetensors"])
def test_pickled_checkpoint_is_refused_not_executed(run_copy, tmp_path, capsys, victim, one_thread):
    marker = tmp_path / "marker.txt"
    import pickle

    blob = pickle.dumps({"weights": _Payload(marker)})
    pickle.loads(blob)  # the payload does run when unpickled: the test can fail
    assert marker.exists()
    marker.unlink()
    ck = list_checkpoints(run_copy)[-1]
    torch.save({"w": _Payload(marker)}, ck / victim)  # torch.save is pickle inside a zip
    _rewrite_manifest(ck)  # the manifest matches: the sha256 check alone cannot save us
    verify_checkpoint(ck)
    with pytest.raises(CheckpointError, match="not a valid safetensors file"):
        load_checkpoint(ck)
    assert not marker.exists()
    # resuming skips it (saying why) and continues from the newest valid one
    code = main(["train", "--out", str(run_copy), "--resume", "--preset", "smoke", "--steps", "8",
                 "--no-progress", "--threads", "1"])
    err = capsys.readouterr().err
    assert code == 0 and "not a valid safetensors file" in err and "from step_00000005" in err
    assert not marker.exists()
    # the final weights file and an explicitly named checkpoint go through the same loader
    if victim == "model.safetensors":
        torch.save({"w": _Payload(marker)}, run_copy / "model.safetensors")
        code = main(["boundaries", str(run_copy), "--text", "hello world"])
        assert code == 2 and "not a valid safetensors file" in _one_line_error(capsys.readouterr().err)
        assert not marker.exists()


FORBIDDEN_CALLS = {"torch.load", "torch.jit.load", "pickle.load", "pickle.loads", "pickle.Unpickler",
                   "marshal.loads", "marshal.load", "pd.read_pickle", "pandas.read_pickle", "eval", "exec",
                   "numpy.load", "np.load", "cloudpickle.load", "dill.load", "joblib.load", "shelve.open"}
FORBIDDEN_MODULES = {"pickle", "cPickle", "dill", "cloudpickle", "joblib", "shelve", "marshal"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def test_no_pickle_on_any_load_path():
    """No module of the package imports a pickle-family module or calls a loader that can
    execute code; numpy loads must pass mmap_mode and never allow_pickle=True."""
    problems = []
    for path in sorted((REPO / "rltok").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Import):
                problems += [f"{where}: import {a.name}" for a in node.names if a.name.split(".")[0] in FORBIDDEN_MODULES]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in FORBIDDEN_MODULES:
                problems.append(f"{where}: from {node.module} import ...")
            elif isinstance(node, ast.Call):
                name = _dotted(node.func)
                kws = {k.arg: k.value for k in node.keywords}
                if name in ("np.load", "numpy.load"):
                    ap = kws.get("allow_pickle")
                    if ap is not None and not (isinstance(ap, ast.Constant) and ap.value is False):
                        problems.append(f"{where}: {name}(allow_pickle=...)")
                elif name in FORBIDDEN_CALLS:
                    problems.append(f"{where}: {name}(...)")
                wo = kws.get("weights_only")
                if wo is not None and not (isinstance(wo, ast.Constant) and wo.value is True):
                    problems.append(f"{where}: weights_only other than True")
    assert not problems, "\n".join(problems)
    # and the scan does see such calls (a scan that cannot fail proves nothing)
    bad = ast.parse("import pickle\ntorch.load(f, weights_only=False)\nnp.load(p, allow_pickle=True)\n")
    calls = [_dotted(n.func) for n in ast.walk(bad) if isinstance(n, ast.Call)]
    assert "torch.load" in calls and "np.load" in calls


# -- 3. numerical faults -----------------------------------------------------------------------------

def _poison(monkeypatch, steps: set[int], how: str = "loss"):
    """Make training_loss non-finite at the given optimizer steps (one micro-step per step):
    a NaN loss, or a finite loss whose gradient is infinite."""
    import rltok.train as tr

    real = tr.training_loss
    calls = {"n": -1}

    def poisoned(model, batch, cfg, **kw):
        out = real(model, batch, cfg, **kw)
        calls["n"] += 1
        if calls["n"] in steps:
            if how == "loss":
                out.loss = out.loss * float("nan")
            else:  # d sqrt(x)/dx at 0 is inf: a finite loss with a non-finite gradient
                p = next(model.parameters())
                out.loss = out.loss + 1e-30 * torch.sqrt(p.sum() * 0)
        return out

    monkeypatch.setattr(tr, "training_loss", poisoned)


def test_nan_steps_are_skipped_logged_and_stop_the_run(tmp_path, data, capsys, monkeypatch, one_thread):
    """Step 2 is NaN (skipped, logged, the run goes on); from step 5 on every step is NaN, so after
    train.max_bad_steps=3 in a row the run stops: exit 3, a clear message, a valid checkpoint whose
    weights and optimizer state are those after step 5's predecessor, and --resume continues."""
    _poison(monkeypatch, {2} | set(range(5, 100)))
    run = tmp_path / "run"
    argv = ["train", "--preset", "smoke", "--data", str(data), "--out", str(run), "--steps", "12",
            "--no-progress", "--set", "train.ckpt_every=1", "--set", "train.max_bad_steps=3",
            "--set", "train.keep_checkpoints=10", "--set", "train.eval_docs=0"]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 3, err
    msg = _one_line_error(err)
    assert "3 consecutive non-finite steps at step 8" in msg and "max_bad_steps=3" in msg
    assert "step_00000008" in msg
    events = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    bad = [e for e in events if e.get("event") == "nonfinite"]
    assert [e["step"] for e in bad] == [2, 5, 6, 7]
    assert [e["consecutive"] for e in bad] == [1, 1, 2, 3] and bad[-1]["total"] == 4
    for e in bad:  # the data position: the step's first and last sequence
        assert e["data_index"] == [e["step"] * 4, e["step"] * 4 + 3]
        assert e["bytes"] == (e["step"] + 1) * 4 * 64
    assert "non-finite loss or gradient at step 2 (sequences 8..11)" in err
    last = load_checkpoint(run / "checkpoints" / "step_00000008")
    before = load_checkpoint(run / "checkpoints" / "step_00000005")
    assert last[2]["bad_steps"] == 4 and last[2]["consecutive_bad_steps"] == 3
    for k in last[0]:  # skipped steps changed neither the weights nor AdamW's moments
        assert torch.equal(last[0][k], before[0][k]) and torch.isfinite(last[0][k]).all()
    for k in last[1]:
        assert torch.equal(last[1][k], before[1][k])
    # the cause removed, --resume continues from the stop
    monkeypatch.undo()
    code = main(argv + ["--resume"])
    err = capsys.readouterr().err
    assert code == 0 and "from step_00000008" in err, err
    assert json.loads((run / "summary.json").read_text())["bad_steps"] == 4


def test_infinite_gradient_with_finite_loss_is_skipped(tmp_path, data, monkeypatch, one_thread):
    _poison(monkeypatch, {3}, how="grad")
    res = train(_cfg(data, steps=6), tmp_path / "run", progress=False)
    assert res.summary["bad_steps"] == 1
    bad = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
           if '"nonfinite"' in x]
    assert len(bad) == 1 and bad[0]["step"] == 3
    assert math.isfinite(bad[0]["loss"]) and not math.isfinite(bad[0]["grad_norm"])
    w = load_tensors(tmp_path / "run" / "model.safetensors")
    assert all(torch.isfinite(v).all() for v in w.values())


# -- 4. disk full / unwritable output ----------------------------------------------------------------

def _enospc_after(monkeypatch, good_checkpoints: int, where: str):
    """Let ``good_checkpoints`` checkpoint writes succeed, then fail like a full disk at ``where``:
    inside safetensors' writer (half a file written), at the rename, or appending metrics."""
    import rltok.checkpoint as ck
    from safetensors import SafetensorError

    n = {"model_writes": 0}
    real_save, real_replace = ck.save_file, os.replace

    def save_file(tensors, filename, metadata=None):
        if filename.endswith("model.safetensors"):
            n["model_writes"] += 1
        if where == "write" and n["model_writes"] > good_checkpoints:
            Path(filename).write_bytes(b"\0" * 1000)  # a partial file, as a full disk leaves it
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        return real_save(tensors, filename, metadata=metadata)

    def replace(src, dst):
        if where == "rename" and n["model_writes"] > good_checkpoints and ".tmp-step_" in str(src):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        return real_replace(src, dst)

    monkeypatch.setattr(ck, "save_file", save_file)
    monkeypatch.setattr(ck.os, "replace", replace)


@pytest.mark.parametrize("where", ["write", "rename"])
def test_disk_full_during_checkpoint(tmp_path, data, capsys, monkeypatch, where, one_thread):
    run = tmp_path / "run"
    _enospc_after(monkeypatch, 3, where)
    code = main(["train", "--preset", "smoke", "--data", str(data), "--out", str(run), "--steps", "12",
                 "--no-progress", "--set", "train.ckpt_every=2", "--set", "train.eval_docs=0"])
    msg = _one_line_error(capsys.readouterr().err)
    assert code == 2
    assert "cannot write checkpoint to" in msg and "step_00000008" in msg and "No space left on device" in msg
    assert "earlier checkpoints are intact" in msg
    assert [p.name for p in list_checkpoints(run)] == ["step_00000002", "step_00000004", "step_00000006"]
    for p in list_checkpoints(run):
        verify_checkpoint(p)
    assert not _stray_temporaries(run)
    monkeypatch.undo()  # space freed: the run resumes from step 6 and finishes
    code = main(["train", "--out", str(run), "--resume", "--preset", "smoke", "--steps", "12", "--no-progress"])
    assert code == 0 and "from step_00000006" in capsys.readouterr().err


def test_unwritable_metrics_and_final_weights(tmp_path, data, capsys, monkeypatch, one_thread):
    """Appending to metrics.jsonl or writing model.safetensors fails: one line naming the file."""
    import builtins

    import rltok.checkpoint as ck

    real_open = builtins.open

    def failing_open(file, mode="r", *a, **kw):
        if str(file).endswith("metrics.jsonl") and "a" in mode:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(file))
        return real_open(file, mode, *a, **kw)

    monkeypatch.setattr(builtins, "open", failing_open)
    code = main(["train", "--preset", "smoke", "--data", str(data), "--out", str(tmp_path / "a"),
                 "--steps", "4", "--no-progress"])
    msg = _one_line_error(capsys.readouterr().err)
    assert code == 2 and "metrics.jsonl" in msg and "Read-only file system" in msg
    monkeypatch.undo()

    def failing_save(tensors, filename, metadata=None):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), filename)

    real_save = ck.save_file
    monkeypatch.setattr(ck, "save_file", lambda t, f, metadata=None: (
        failing_save(t, f) if ".model.safetensors.tmp-" in f else real_save(t, f, metadata=metadata)))
    code = main(["train", "--preset", "smoke", "--data", str(data), "--out", str(tmp_path / "b"),
                 "--steps", "4", "--no-progress"])
    msg = _one_line_error(capsys.readouterr().err)
    assert code == 2 and "model.safetensors" in msg and "No space left on device" in msg
    assert not list((tmp_path / "b").glob(".*tmp*"))
    verify_checkpoint(list_checkpoints(tmp_path / "b")[-1])  # the last checkpoint holds the weights


def test_out_not_creatable(tmp_path, capsys, data):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code = main(["train", "--preset", "smoke", "--data", str(data), "--out", str(blocker / "run")])
    msg = _one_line_error(capsys.readouterr().err)
    assert code == 2 and "cannot create the run directory" in msg and str(blocker) in msg


def _private_mount(probe_dir: Path) -> list[str] | None:
    """A command prefix that runs a shell in a private mount namespace where tmpfs can be
    mounted (as root, or through an unprivileged user namespace); None if neither works."""
    if shutil.which("unshare") is None:
        return None
    for flags in (["-m"], ["-r", "-m"]):
        r = subprocess.run(["unshare", *flags, "mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe_dir)],
                           capture_output=True, timeout=30)
        if r.returncode == 0:
            return ["unshare", *flags]
    return None


def test_real_full_and_read_only_tmpfs(tmp_path, data):
    """A real file system: a 2.5 MB tmpfs fills up after a few checkpoints (about 0.7 MB each):
    one line, the checkpoints on it intact, and the run, moved to a disk with room, resumes to the
    same weights as an uninterrupted run; the tmpfs remounted read-only, --resume fails with one
    line. Needs a private mount namespace (root, or user namespaces)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    prefix = _private_mount(mnt)
    if prefix is None:
        pytest.skip("cannot mount a private tmpfs here (neither root nor user namespaces)")
    saved = tmp_path / "saved"
    train_cmd = (f"{sys.executable} -m rltok train --preset smoke --data {data} --steps 12 --no-progress "
                 f"--threads 1 --set train.ckpt_every=1 --set train.eval_docs=0 --set train.keep_checkpoints=100")
    script = f"""
mount -t tmpfs -o size=2500k tmpfs {mnt} || exit 90
{train_cmd} --out {mnt}/run 2> {tmp_path}/full.err; echo $? > {tmp_path}/full.code
cp -a {mnt}/run {saved}
mount -o remount,ro {mnt} || exit 91
{train_cmd} --out {mnt}/run --resume 2> {tmp_path}/ro.err; echo $? > {tmp_path}/ro.code
"""
    r = subprocess.run(prefix + ["sh", "-c", script], env=faults.env(), capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    # full disk
    err = (tmp_path / "full.err").read_text()
    assert (tmp_path / "full.code").read_text().strip() == "2", err
    msg = _one_line_error(err)
    assert "No space left on device" in msg and "cannot write" in msg
    cks = list_checkpoints(saved)
    assert len(cks) >= 2
    for p in cks:
        verify_checkpoint(p)
    assert not _stray_temporaries(saved)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        res = train(_cfg(data, steps=12, **{"train.keep_checkpoints": 100}), saved, resume=True, progress=False)
    finally:
        torch.set_num_threads(threads)
    assert res.exit_code == 0
    _assert_identical(_reference(tmp_path, data, "rl", 12, keep=100), saved)
    # read-only
    err = (tmp_path / "ro.err").read_text()
    assert (tmp_path / "ro.code").read_text().strip() == "2", err
    assert "Read-only file system" in _one_line_error(err)


# -- 6. signals --------------------------------------------------------------------------------------

def test_second_sigint_aborts_at_once(tmp_path, data):
    """The first SIGINT asks for a checkpoint; the second, arriving while that checkpoint is being
    written (held open by the fault hook), aborts at once: exit 130, no traceback, the partial
    checkpoint removed, the earlier one intact."""
    run = tmp_path / "run"
    pause = 3.0
    p = faults.Proc(faults.train_argv(run, data, "rl", 200), tmp_path, {faults.FAULT_ENV: str(pause)})
    assert p.wait_mark(1)  # inside the write of checkpoint 1 (which completes after the pause)
    p.p.send_signal(signal.SIGINT)
    assert p.wait_mark(2)  # checkpoint 1's rename pause, then the stop's checkpoint 2 pauses
    t = time.monotonic()
    p.p.send_signal(signal.SIGINT)
    assert p.wait(60) == 130
    assert time.monotonic() - t < pause - 0.5  # at once, not after the pause
    err = p.stderr
    assert "Traceback" not in err and "second SIGINT: aborting now" in err
    cks = list_checkpoints(run)
    assert [c.name for c in cks] == ["step_00000001"]
    verify_checkpoint(cks[0])
    assert not _stray_temporaries(run)
