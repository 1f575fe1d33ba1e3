"""Resident memory of a real `rltok train` process over a run, for this checkout and a base revision.

    python benchmarks/train_memory.py --base feecce1 --bytes 2M --threads 1 \
        --data ../shared/data/webtext/c4/c4_sample.jsonl --out-dir runs/mem

Starts `rltok train --method rl --preset tiny` for the base (a git worktree, through PYTHONPATH)
and for this checkout side by side (one thread each by default), samples each process's RSS
(/proc/PID/status VmRSS) every second together with the bytes its metrics.jsonl has logged, and
prints RSS after the first logged step, at the end and the peak. ``--json`` keeps the samples.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_revisions import REPO, worktree  # noqa: E402


def rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def logged_bytes(run: Path) -> int:
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    for line in reversed(lines):
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "bytes" in d and "bpb" in d:
            return int(d["bytes"])
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="feecce1")
    ap.add_argument("--bytes", default="2M")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", default="stdlib", help="the same corpus for base and head (the tiny preset's default changed to english after feecce1)")
    ap.add_argument("--out-dir", default="runs/mem")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    procs = {}
    for label, root in (("base", worktree(args.base)), ("head", REPO)):
        run = out / f"{label}_s{args.seed}"
        cmd = [sys.executable, "-m", "rltok", "train", "--method", "rl", "--preset", "tiny", "--bytes", args.bytes,
               "--seed", str(args.seed), "--threads", str(args.threads), "--no-progress", "--out", str(run)]
        if args.data:
            cmd += ["--data", args.data]
        env = dict(os.environ, PYTHONPATH=str(root))
        log = open(out / f"{label}_s{args.seed}.log", "w")
        procs[label] = (subprocess.Popen(cmd, env=env, stdout=log, stderr=log, cwd=str(REPO)), run, [])
    while any(p.poll() is None for p, _, _ in procs.values()):
        for p, run, samples in procs.values():
            if p.poll() is None:
                samples.append((time.time(), rss(p.pid), logged_bytes(run)))
        time.sleep(1.0)
    result = {}
    for label, (p, run, samples) in procs.items():
        logged = [s for s in samples if s[2] > 0]
        first = logged[0] if logged else samples[0]
        result[label] = {"exit": p.returncode, "rss_first_logged_step": first[1], "bytes_at_first": first[2],
                         "rss_end": samples[-1][1], "bytes_at_end": samples[-1][2],
                         "rss_peak": max(s[1] for s in samples), "samples": samples}
        print(f"{label} ({args.base if label == 'base' else 'this checkout'}): exit {p.returncode}, RSS "
              f"{first[1] / 2**20:,.0f} MB at {first[2]:,} bytes -> {samples[-1][1] / 2**20:,.0f} MB at "
              f"{samples[-1][2]:,} bytes, peak {result[label]['rss_peak'] / 2**20:,.0f} MB")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), **result}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
