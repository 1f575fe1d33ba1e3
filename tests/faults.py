"""Fault injection for the tests of test_faults.py: training subprocesses killed at chosen or
random moments, then resumed, with a tally of injected faults and of data lost.

A *kill chain* trains a run with ``python -m rltok train`` (one process, or ``torchrun`` with two),
kills it, resumes it with ``--resume``, kills it again, ... and finally lets it finish. After every
kill it checks what a user would find on disk: every visible checkpoint verifies, and the resume
continues from the newest one. The final weights are then compared with an uninterrupted run.

*Data lost* counts kills after which a checkpoint that was complete before the kill is unusable or
skipped, or the resumed run restarts from an older step than the newest complete checkpoint, plus
chains whose final weights differ from the uninterrupted run.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rltok.checkpoint import CheckpointError, list_checkpoints, verify_checkpoint

REPO = Path(__file__).resolve().parents[1]
FAULT_ENV = "RLTOK_FAULT_SLEEP_IN_CHECKPOINT"


def env(**extra: str) -> dict[str, str]:
    e = dict(os.environ)
    e.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO) + os.pathsep + e.get("PYTHONPATH", ""),
             PYTHONUNBUFFERED="1")
    e.pop(FAULT_ENV, None)
    e.update(extra)
    return e


def train_argv(out: Path, data: Path, method: str, steps: int, extra: list[str] = (),
               torchrun: bool = False) -> list[str]:
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m"]
                if torchrun else [sys.executable, "-m"])
    argv = launcher + ["rltok", "train", "--method", method, "--preset", "smoke", "--data", str(data),
                       "--out", str(out), "--steps", str(steps), "--no-progress", "--threads", "1",
                       "--set", "train.ckpt_every=1", "--set", "train.eval_docs=0",
                       "--set", "train.keep_checkpoints=2"]
    return argv + list(extra)


@dataclass
class Tally:
    """Faults injected per kind, and how many lost data."""

    injected: dict[str, int] = field(default_factory=dict)
    lost: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, kind: str, lost: bool = False, note: str = "") -> None:
        self.injected[kind] = self.injected.get(kind, 0) + 1
        self.lost[kind] = self.lost.get(kind, 0) + int(lost)
        if lost and note:
            self.notes.append(f"{kind}: {note}")

    def merge(self, other: "Tally") -> None:
        for k, v in other.injected.items():
            self.injected[k] = self.injected.get(k, 0) + v
            self.lost[k] = self.lost.get(k, 0) + other.lost.get(k, 0)
        self.notes += other.notes

    def report(self) -> str:
        rows = [f"  {k:34s} injected {v:3d}   lost data {self.lost.get(k, 0)}" for k, v in sorted(self.injected.items())]
        return "\n".join(["fault injection summary:", *rows, *self.notes])

    def save(self, path: Path) -> None:
        """Accumulate into a JSON file (e.g. $RLTOK_FAULT_TALLY) across tests of a session."""
        old = Tally(**json.loads(path.read_text())) if path.is_file() else Tally()
        old.merge(self)
        path.write_text(json.dumps({"injected": old.injected, "lost": old.lost, "notes": old.notes}, indent=1))


class Proc:
    """A subprocess whose stderr is read in the background (to see the fault hook's marks)."""

    def __init__(self, argv: list[str], cwd: Path, extra_env: dict[str, str] | None = None):
        self.p = subprocess.Popen(argv, cwd=cwd, env=env(**(extra_env or {})), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, errors="replace",
                                  start_new_session=True)
        self.err: list[str] = []
        self.out: list[str] = []
        self._marks = threading.Semaphore(0)
        self._threads = [threading.Thread(target=self._read, args=(self.p.stderr, self.err, True), daemon=True),
                         threading.Thread(target=self._read, args=(self.p.stdout, self.out, False), daemon=True)]
        for t in self._threads:
            t.start()

    def _read(self, stream, sink: list[str], marks: bool) -> None:
        for line in stream:
            sink.append(line)
            if marks and line.startswith("rltok-fault: pausing"):
                self._marks.release()

    def wait_mark(self, n: int, timeout: float = 120) -> bool:
        """Wait for the n-th pause mark of the checkpoint fault hook."""
        end = time.monotonic() + timeout
        for _ in range(n):
            if not self._marks.acquire(timeout=max(0.0, end - time.monotonic())):
                return False
        return True

    def wait(self, timeout: float = 300) -> int:
        try:
            code = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill_group(signal.SIGKILL)
            code = self.p.wait(30)
        for t in self._threads:
            t.join(5)
        return code

    def kill_group(self, sig: int) -> None:
        try:
            os.killpg(self.p.pid, sig)
        except ProcessLookupError:
            pass

    @property
    def stderr(self) -> str:
        return "".join(self.err)


def complete_checkpoints(run: Path) -> dict[int, bool]:
    """{step: verifies} for every visible checkpoint directory."""
    out = {}
    for p in list_checkpoints(run):
        try:
            verify_checkpoint(p)
            out[int(p.name[5:])] = True
        except CheckpointError:
            out[int(p.name[5:])] = False
    return out


def resumed_from(stderr: str) -> int | None:
    """The step a resumed run reports it continues from (None: it started from step 0)."""
    for line in stderr.splitlines():
        if line.startswith("rltok: resuming "):
            return int(line.split("(step ", 1)[1].split(",", 1)[0])
    return None


def children(pid: int) -> list[int]:
    kids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                kids.append(int(d.name))
    return kids


def alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def kill_chain(run: Path, data: Path, method: str, steps: int, kills: list[str], rng: random.Random,
               tally: Tally, torchrun: bool = False, extra: list[str] = (), mark_sleep: float = 0.3,
               max_delay: float = 1.0) -> None:
    """Train ``run`` with one fault per entry of ``kills``, resuming after each, then finish.

    Kinds: ``sigkill-random`` (SIGKILL to every training process after a random delay once
    training is under way, as a preemption or the OOM killer would), ``sigkill-in-checkpoint``
    (SIGKILL inside a checkpoint write, through the fault hook), ``sigint``/``sigterm`` (to the
    launched process at a random moment: a final checkpoint, exit 130/143), and under torchrun
    ``sigkill-one-worker`` (rank 1 only; torchrun tears the rest down) and ``sigkill-agent`` (the
    torchrun agent only; its orphaned workers checkpoint and exit by themselves).
    """
    cwd = run.parent
    expected: int | None = None  # the step the next start must resume from
    for i, kind in enumerate([*kills, None]):
        resume = (run / "config.json").exists()
        argv = train_argv(run, data, method, steps, [*extra, *(["--resume"] if resume else [])], torchrun)
        before = complete_checkpoints(run)
        newest_before = max([s for s, ok in before.items() if ok], default=None)
        proc = Proc(argv, cwd, {FAULT_ENV: str(mark_sleep)} if kind == "sigkill-in-checkpoint" else {})
        if kind is None:  # the last start: no fault, the run must finish
            code = proc.wait()
            assert code == 0, f"final resume failed ({code}):\n{proc.stderr[-4000:]}"
        else:
            killed = _inject(proc, kind, run, rng, newest_before, max_delay)
            code = proc.wait()
            if not killed:
                tally.notes.append(f"{kind}: the run ended (exit {code}) before the fault was injected")
            elif kind in GRACEFUL and _finished(run):  # the signal came in the final phase or at exit
                killed = False
                tally.notes.append(f"{kind}: the run had finished its training (exit {code}) when the signal came")
            elif kind in GRACEFUL:
                _check_graceful_stop(proc, kind, code, run, torchrun)
        if resume and resumed_from(proc.stderr) != expected:
            # this start went back further than the newest complete checkpoint (or skipped ahead)
            tally.add("resume-mismatch", lost=True,
                      note=f"start {i} resumed from {resumed_from(proc.stderr)}, expected {expected}")
        if kind is None:
            continue
        if not killed:
            expected = max([s for s, ok in complete_checkpoints(run).items() if ok], default=None)
            continue
        if kind == "sigkill-agent":
            _wait_gone(proc.workers)  # the lock keeps a resume out until they are gone
        after = complete_checkpoints(run)
        note = ""
        if not all(after.values()):
            note = f"kill {i}: damaged visible checkpoint(s) {sorted(s for s, ok in after.items() if not ok)}"
        elif newest_before is not None and max(after, default=-1) < newest_before:
            note = f"kill {i}: newest checkpoint went back from {newest_before} to {max(after, default=None)}"
        tally.add(kind, lost=bool(note), note=note)
        expected = max([s for s, ok in after.items() if ok], default=None)


GRACEFUL = {"sigint": (signal.SIGINT, 130), "sigterm": (signal.SIGTERM, 143)}


def _finished(run: Path) -> bool:
    try:
        return bool(json.loads((run / "summary.json").read_text()).get("finished"))
    except (OSError, ValueError):
        return False


def _check_graceful_stop(proc: Proc, kind: str, code: int, run: Path, torchrun: bool) -> None:
    """A signal stops training with a final checkpoint at the step it reports, and exit 130/143
    (torchrun's agent itself exits 1 after forwarding the signal to its workers)."""
    err = proc.stderr
    assert code == (1 if torchrun else GRACEFUL[kind][1]), f"{kind}: exit {code}\n{err[-3000:]}"
    stopped = [line for line in err.splitlines() if line.startswith("rltok: stopped at step")]
    assert stopped, err[-3000:]
    step = int(stopped[0].split("step ")[1].split(";")[0])
    assert max(complete_checkpoints(run)) == step
    if not torchrun:
        assert "Traceback" not in err, err


def _wait_gone(pids: list[int], timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    for pid in pids:
        while alive(pid) and time.monotonic() < end:
            time.sleep(0.1)
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def _inject(proc: Proc, kind: str, run: Path, rng: random.Random, newest_before: int | None,
            max_delay: float) -> bool:
    """Inject one fault into a running training; False if it ended first."""
    proc.workers = []  # type: ignore[attr-defined]
    if kind == "sigkill-in-checkpoint":
        # the hook pauses twice per checkpoint (after model.safetensors, before the rename)
        if not proc.wait_mark(rng.randint(1, 4)):
            return False
    else:
        # wait until training is under way (a new checkpoint appears), then a random delay
        end = time.monotonic() + 180
        while proc.p.poll() is None and time.monotonic() < end:
            done = [s for s, ok in complete_checkpoints(run).items() if ok]
            if done and (newest_before is None or max(done) > newest_before):
                break
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, max_delay))
    if proc.p.poll() is not None:
        return False
    workers = sorted(children(proc.p.pid))  # torchrun's workers (in sessions of their own)
    proc.workers = workers  # type: ignore[attr-defined]
    if kind in GRACEFUL:
        proc.p.send_signal(GRACEFUL[kind][0])
        return True
    if kind in ("sigkill-random", "sigkill-in-checkpoint"):
        proc.kill_group(signal.SIGKILL)
        for pid in workers:
            _kill(pid)
        return True
    if kind == "sigkill-one-worker":
        if len(workers) < 2:
            return False
        _kill(workers[-1])  # started second: usually rank 1
        return True
    if kind == "sigkill-agent":
        _kill(proc.p.pid)
        return True
    raise ValueError(kind)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
