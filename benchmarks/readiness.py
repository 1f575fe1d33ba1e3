#!/usr/bin/env python
"""The paper's shapes, run for real on the CPU, against the memory model of ``rltok plan``.

For each size (default 18M and 147M): two optimizer steps of two micro-batches of one sequence at
the preset's real length (4,096 bytes), the second measured (AdamW's state made, gradients held
across micro-batches: as training runs), on the accelerator path (static chunk shapes, SDPA attention, the
parallel policy scan), in a fresh process: its time, its FLOPs counted by torch's
FlopCounterMode against rltok.flops, its host syncs, and its peak memory (max RSS minus the
process's RSS before the model was built) against the model's prediction at fp32. Then the
147M steps under ``torchrun --nproc_per_node=2`` with FSDP2 on gloo (two steps, each rank two
micro-batches) (peak RSS of the largest
rank), and the 346M preset's forward alone. Results go to results/scaling/readiness.json
(with the GPU figures of results/gpu/gpu_check.json beside the model, when that file exists).

    python benchmarks/readiness.py                 # everything (about 5-10 minutes on 2 cores)
    python benchmarks/readiness.py --sizes 18M --no-fsdp --no-346m   # quick
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
GIB = 2**30


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _corpus(tmp: Path) -> Path:
    """This repository's own source as a JSONL corpus (real text, no download)."""
    path = tmp / "corpus.jsonl"
    if not path.exists():
        with open(path, "w") as f:
            for p in sorted((REPO / "rltok").rglob("*.py")):
                f.write(json.dumps({"text": p.read_text()}) + "\n")
    return path


def one_step(preset: str, corpus: str) -> dict:
    """Runs in its own process: the second of two 147M/18M steps (2 micro-batches of 1), measured."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from rltok.bench import Bench
    from rltok.flops import training_flops_per_byte
    from rltok.plan import memory_plan
    from rltok.syncs import SyncCounter, force_accelerator_path

    # two optimizer steps of two micro-batches each: the second runs as training does, with the
    # AdamW state made and the first micro-batch's gradients held while the second's activations are
    over = {"data.source": corpus, "train.batch_size": 2, "train.micro_batch": 1, "train.batch_bytes": 0,
            "train.dtype": "fp32", "model.static_chunks": "on", "data.min_doc_bytes": 1, "data.val_docs": 8}
    base = _rss()
    with force_accelerator_path():
        b = Bench("rl", preset, over, "cpu")
        b.step_fn(0, b.cfg.train.lr)
        t = time.perf_counter()
        with FlopCounterMode(display=False) as fc, SyncCounter() as sc:
            out = b.step_fn(1, b.cfg.train.lr)
        dt = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    nb, nv = (sum(float(st[k]) for st in out.stats) for k in ("n_boundary", "n_valid"))
    rate = nb / max(nv, 1)
    analytic = training_flops_per_byte(b.model, b.cfg, rate)
    counted = fc.get_total_flops() / len(out.stats)  # per sequence
    plan = memory_plan(b.cfg, gpus=1, micro_batch=1, dtype="fp32")
    return {"preset": preset, "params": plan.params, "seq_len": b.cfg.model.seq_len, "step_seconds": round(dt, 2), "sequences_per_step": len(out.stats),
            "rate": round(rate, 4), "flops_counted": counted,
            "flops_analytic_matmul": analytic.matmul_per_byte * b.cfg.model.seq_len,
            "flops_analytic": analytic.per_byte * b.cfg.model.seq_len,
            "matmul_flops_ratio": counted / (analytic.matmul_per_byte * b.cfg.model.seq_len),
            "syncs": len(sc.events), "sync_sites": sc.by_site(),
            "peak_memory_bytes": peak, "predicted_peak_bytes": plan.peak_bytes,
            "predicted_over_measured": plan.peak_bytes / peak, "plan": plan.to_dict(),
            "threads": torch.get_num_threads()}


def forward_only(preset: str) -> dict:
    import torch

    from rltok.config import build_config
    from rltok.methods import get_method
    from rltok.syncs import force_accelerator_path

    base = _rss()
    cfg = build_config("rl", preset, overrides={"model.static_chunks": "on", "train.dtype": "fp32"})
    model = get_method("rl").build(cfg, None).train()
    S = cfg.model.seq_len
    ids = torch.randint(0, 256, (1, S))
    t = time.perf_counter()
    with force_accelerator_path(), torch.no_grad():
        out = model(ids, noise=torch.rand(1, S))
    dt = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    return {"preset": preset, "params": sum(p.numel() for p in model.parameters()), "forward_seconds": round(dt, 2),
            "peak_memory_bytes": peak, "chunks": int(out.chunks.counts[0])}


# glibc keeps freed small blocks in its arenas, so the max RSS of a process that frees and
# reallocates activations overstates its live tensors; with large blocks mmapped (and unmapped on
# free) the max RSS follows the live memory, as a GPU allocator's peak does
MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


def _child(fn: str, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "RLTOK_CPU_DTYPE": "fp32", **MALLOC}
    r = subprocess.run([sys.executable, __file__, "--child", fn, *args], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        return {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"rc={r.returncode}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def fsdp_step(corpus: str, tmp: Path) -> dict:
    from rltok.config import build_config
    from rltok.plan import memory_plan

    out = tmp / "fsdp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "rltok", "train",
           "--method", "rl", "--preset", "147M", "--data", corpus, "--out", str(out), "--steps", "2",
           "--batch-bytes", str(4 * 4096), "--micro-batch", "1", "--parallel", "fsdp", "--no-progress",
           "--set", "train.dtype=fp32", "--set", "model.static_chunks=on", "--set", "data.min_doc_bytes=1",
           "--set", "train.eval_docs=1", "--set", "data.val_docs=1", "--set", "train.eval_every_bytes=0"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "RLTOK_ACCELERATOR_PATH": "1", **MALLOC}
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # the largest descendant
    cfg = build_config("rl", "147M", overrides={"train.micro_batch": 1})
    plan = memory_plan(cfg, gpus=2, parallel="fsdp", micro_batch=1, dtype="fp32")
    res = {"processes": 2, "parallel": "fsdp2 (gloo)", "rc": r.returncode, "wall_seconds": round(dt, 1),
           "peak_memory_bytes_largest_rank": peak, "predicted_peak_bytes": plan.peak_bytes,
           "predicted_over_measured": plan.peak_bytes / peak if peak else None}
    if r.returncode != 0:
        res["error"] = "\n".join(r.stderr.strip().splitlines()[-5:])
    return res


def summarize(cpu_path: Path, out: Path) -> dict:
    """results/scaling/readiness.json: the issue's figures, each from a record (the CPU run
    above, the GPU run's results/gpu/*.json) beside the model's predictions (rltok plan)."""
    from rltok.config import build_config
    from rltok.plan import GPUS, memory_plan, time_plan

    cpu = json.loads(cpu_path.read_text())
    gpu = {}
    for name in ("gpu_check.json", "gpu_check2.json"):
        p = REPO / "results" / "gpu" / name
        if p.is_file():
            d = json.loads(p.read_text())
            gpu.update({r["check"]: {**r, "env": d["env"]} for r in d["results"]})
    step147 = next((s for s in cpu["steps"] if s.get("preset") == "147M"), {})
    recipe = build_config(None, None, recipe="paper-147m-fineweb")
    predicted = {}
    m = memory_plan(recipe, gpus=8)
    for kind in GPUS:
        predicted[kind] = {"gpus": 8, "peak_memory_bytes_per_gpu": m.peak_bytes, **time_plan(recipe, kind, 8, m.peak_bytes).to_dict()}
    one = memory_plan(build_config("rl", "147M"), gpus=1)
    measured_gpu = {tag: {"peak_memory_bytes": int(gpu[f"bench_rl{tag}"]["peak_memory_gb"] * 2**30),
                          "step_seconds": gpu[f"bench_rl{tag}"]["step_s"], "mfu": gpu[f"bench_rl{tag}"]["mfu"],
                          "predicted_over_measured": one.peak_bytes / (gpu[f"bench_rl{tag}"]["peak_memory_gb"] * 2**30)}
                    for tag in ("", "_dynamic", "_compiled", "_fullgraph") if f"bench_rl{tag}" in gpu}
    res = {
        "syncs_per_step": {"cpu_accelerator_path": {s["preset"]: s.get("syncs") for s in cpu["steps"]},
                           **{k: v["syncs"] for k, v in gpu.items() if k.startswith("syncs_")}},
        "graph_breaks": {k: v["graph_breaks"] for k, v in gpu.items() if k.startswith("fullgraph_")},
        "step_147m_seconds": {"cpu_fp32_2_micro_batches_of_1_one_thread": step147.get("step_seconds"),
                              "h200_bf16_128x4096": {t or "_eager_static": v["step_seconds"] for t, v in measured_gpu.items()}},
        "peak_memory_147m_bytes": {"cpu_fp32_2_micro_batches_of_1": step147.get("peak_memory_bytes"),
                                   "cpu_fsdp2_2_processes_largest_rank": (cpu.get("fsdp") or {}).get("peak_memory_bytes_largest_rank"),
                                   "h200_bf16_micro_batch_8": {t or "_eager_static": v["peak_memory_bytes"] for t, v in measured_gpu.items()}},
        "model_checks": {"cpu": [{k: s.get(k) for k in ("preset", "peak_memory_bytes", "predicted_peak_bytes", "predicted_over_measured",
                                                        "flops_counted", "flops_analytic", "matmul_flops_ratio")} for s in cpu["steps"]],
                         "cpu_fsdp2": cpu.get("fsdp"),
                         "h200_micro_batch_8": {"predicted_peak_bytes": one.peak_bytes,
                                                **{t or "_eager_static": v["predicted_over_measured"] for t, v in measured_gpu.items()}}},
        "predicted": predicted,
        "forward_346m": cpu.get("forward_346m"),
        "sources": {"cpu": str(cpu_path.resolve().relative_to(REPO)), "gpu": "results/gpu/gpu_check*.json"},
    }
    out.write_text(json.dumps(res, indent=2) + "\n")
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="18M,147M")
    ap.add_argument("--no-fsdp", action="store_true")
    ap.add_argument("--no-346m", action="store_true")
    ap.add_argument("--out", default=str(REPO / "results" / "scaling" / "readiness_cpu.json"))
    ap.add_argument("--child", nargs="+", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--summary-only", action="store_true", help="only (re)write readiness.json from the records")
    args = ap.parse_args(argv)
    summary = REPO / "results" / "scaling" / "readiness.json"
    if args.summary_only:
        summarize(Path(args.out), summary)
        print(summary.read_text())
        return 0
    if args.child:
        fn, *rest = args.child
        print(json.dumps({"one_step": one_step, "forward_only": forward_only}[fn](*rest)))
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="rltok-readiness-"))
    corpus = str(_corpus(tmp))
    res = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                       "python": platform.python_version()}, "steps": [], "fsdp": None, "forward_346m": None}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save():
        out.write_text(json.dumps(res, indent=2) + "\n")

    for size in args.sizes.split(","):
        r = _child("one_step", size, corpus)
        res["steps"].append(r)
        save()
        print(json.dumps({k: v for k, v in r.items() if k not in ("plan", "sync_sites")}), flush=True)
    if not args.no_fsdp:
        res["fsdp"] = fsdp_step(corpus, tmp)
        save()
        print(json.dumps(res["fsdp"]), flush=True)
    if not args.no_346m:
        res["forward_346m"] = _child("forward_only", "346M")
        save()
        print(json.dumps(res["forward_346m"]), flush=True)
    summarize(out, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
