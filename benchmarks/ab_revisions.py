"""A/B: the training step of two revisions of rltok, on the same real batches, step by step.

    python benchmarks/ab_revisions.py --base feecce1 --threads 1 --steps 20 \
        --data ../shared/data/webtext/c4/c4_sample.jsonl [--init-from RUN] [--set key=value]

Each revision runs in its own worker process (the base from a ``git worktree`` of ``--base``,
imported through PYTHONPATH; the head from this checkout, or from ``--head REV``), built exactly
as ``rltok bench`` builds a model (:class:`rltok.bench.Bench`: the same preset, method, seed and
stateless data loader, so step k reads the same batch in both). After warm-up the parent
alternates the two, A B, B A, A B, ... one step at a time, so load on the machine hits both
alike; the figure of merit is the median of per-pair ratios (base step / head step = the head's
speed-up) with its quartiles and range. Printed beside it, per revision: median step time,
bytes/s, model TFLOP/s at the achieved rate, MFU against a bf16 matmul measured in that worker
process, peak and current RSS (at the first and the last timed step), the thread count and the
load average before and after. ``--json PATH`` writes everything, per-step times included.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


# -- the worker: one revision's Bench, driven over stdin/stdout ------------------------------------

def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker(args) -> None:
    import resource

    import torch

    torch.set_num_threads(args.threads)
    from rltok.bench import Bench, measure_matmul_peak

    over = dict(kv.split("=", 1) for kv in args.set)  # strings: build_config coerces them
    if args.data:
        over["data.source"] = args.data
    b = Bench(args.method, args.preset, overrides=over, device="cpu", init_from=args.init_from or None)
    for _ in range(args.warmup):
        b.step(record=False)
    out = sys.stdout
    out.write(json.dumps({"ready": True, "rltok": __import__("rltok").__file__}) + "\n")
    out.flush()
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "step":
            dt = b.step()
            out.write(json.dumps({"dt": dt, "rss": _rss_bytes()}) + "\n")
        elif cmd == "peak":
            out.write(json.dumps({"peak": measure_matmul_peak(torch.device("cpu"), b.cfg.train.dtype, 1.0)}) + "\n")
        elif cmd.startswith("result"):
            peak = float(cmd.split()[1])
            r = b.result(peak, "measured dense bf16 matmul in this process", peak).to_dict()
            r["max_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            out.write(json.dumps(r) + "\n")
        elif cmd == "quit":
            break
        out.flush()


# -- the parent --------------------------------------------------------------------------------------

class Worker:
    def __init__(self, label: str, root: Path, args, extra: list[str] = ()):
        self.label, self.root = label, root
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--threads", str(args.threads),
               "--method", args.method, "--preset", args.preset, "--warmup", str(args.warmup)]
        if args.data:
            cmd += ["--data", str(Path(args.data).resolve())]
        if args.init_from:
            cmd += ["--init-from", str(Path(args.init_from).resolve())]
        for kv in [*args.set, *extra]:
            cmd += ["--set", kv]
        # the oneDNN kernel-cache bound the CLI sets (rltok/cli/__init__.py), so memory is as in training
        env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS=str(args.threads),
                   ONEDNN_PRIMITIVE_CACHE_CAPACITY=os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "256"))
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                     cwd=str(REPO))
        self.ready = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"{self.label}: worker exited (rc {self.proc.wait()})")
        return json.loads(line)

    def ask(self, cmd: str) -> dict:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        self.proc.wait(timeout=60)


def worktree(rev: str) -> Path:
    sha = subprocess.run(["git", "rev-parse", "--short=12", rev], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout.strip()
    path = Path(tempfile.gettempdir()) / f"rltok-ab-{sha}"
    if not (path / "rltok").is_dir():
        subprocess.run(["git", "worktree", "add", "--force", "--detach", str(path), sha], cwd=REPO, check=True,
                       capture_output=True)
    return path


def quartiles(x: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(x, n=4) if len(x) > 1 else [x[0]] * 3
    return q[0], q[1], q[2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="feecce1", help="the revision to compare against (default: feecce1)")
    ap.add_argument("--head", default="", help="a revision for B (default: this checkout, as it is)")
    ap.add_argument("--method", default="rl")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--data", default="", help="corpus (default: the preset's)")
    ap.add_argument("--init-from", default="", help="a trained run of this method (its learned rate)")
    ap.add_argument("--set", action="append", default=[], help="config override key=value, for both")
    ap.add_argument("--base-set", action="append", default=[], help="config override for the base only")
    ap.add_argument("--head-set", action="append", default=[], help="config override for the head only")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", default="")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return 0

    load0 = os.getloadavg()
    roots = {"base": worktree(args.base), "head": worktree(args.head) if args.head else REPO}
    extra = {"base": args.base_set, "head": args.head_set}
    ws = {k: Worker(k, r, args, extra[k]) for k, r in roots.items()}  # built one after the other
    try:
        times = {k: [] for k in ws}
        rss = {k: [] for k in ws}
        for i in range(args.steps):
            order = ["base", "head"] if i % 2 == 0 else ["head", "base"]
            for k in order:
                r = ws[k].ask("step")
                times[k].append(r["dt"])
                rss[k].append(r["rss"])
            print(f"\rstep {i + 1}/{args.steps}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        peaks = {k: w.ask("peak")["peak"] for k, w in ws.items()}
        results = {k: w.ask(f"result {peaks[k]}") for k, w in ws.items()}
    finally:
        for w in ws.values():
            w.close()
    load1 = os.getloadavg()
    ratios = [a / b for a, b in zip(times["base"], times["head"])]
    q1, med, q3 = quartiles(ratios)
    rev = {"base": " ".join([args.base, *args.base_set]), "head": " ".join([args.head or "working tree", *args.head_set])}
    lines = [f"{args.method} {args.preset}, {args.threads} thread(s), {args.steps} paired steps after "
             f"{args.warmup} warm-up, load average {load0[0]:.2f} -> {load1[0]:.2f}",
             "", "| revision | step s (median) | bytes/s | rate | TFLOP/s | matmul peak | MFU | RSS first -> last step | max RSS |",
             "|---|---|---|---|---|---|---|---|---|"]
    for k in ("base", "head"):
        r = results[k]
        lines.append(f"| {k} ({rev[k]}) | {statistics.median(times[k]):.3f} | {r['bytes_per_s']:,.0f} | "
                     f"{r['rate']:.3f} | {r['model_flops_per_s'] / 1e12:.3f} | {peaks[k] / 1e12:.2f} TFLOP/s | "
                     f"{100 * r['model_flops_per_s'] / peaks[k]:.1f}% | {rss[k][0] / 2**20:,.0f} -> "
                     f"{rss[k][-1] / 2**20:,.0f} MB | {r['max_rss'] / 2**20:,.0f} MB |")
    lines.append("")
    lines.append(f"speed-up (base step / head step, per pair): median {med:.3f}, quartiles {q1:.3f}-{q3:.3f}, "
                 f"range {min(ratios):.3f}-{max(ratios):.3f}")
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "args": {k: v for k, v in vars(args).items() if k != "worker"}, "revisions": rev,
            "load_average": [load0, load1], "speedup_median": med, "speedup_quartiles": [q1, q3],
            "speedup_range": [min(ratios), max(ratios)], "times": times, "rss": rss, "peaks": peaks,
            "results": results, "modules": {k: w.ready["rltok"] for k, w in ws.items()}}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
