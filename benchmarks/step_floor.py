"""Where the floor of the CPU training step is: each op's measured time against its roofline.

    python benchmarks/step_floor.py --threads 1 --data ../shared/data/webtext/c4/c4_sample.jsonl \
        [--init-from RUN] [--json PATH]

Profiles ``--steps`` real training steps (:class:`rltok.bench.Bench`, the step ``rltok train``
runs) with torch.profiler and, in the same process, measures two machine limits: the dense
matmul rate in the dtype the step runs in (:func:`rltok.bench.measure_matmul_peak`: the best of a
1024^3 square and the model's own shapes) and the memory bandwidth of a streaming
float32 triad (a = b + s * c over 3 x 128 MB). Every leaf op (no aten op below it) is then one of

* a matmul (mm, bmm, addmm, baddbmm): its floor is its FLOPs at the measured matmul rate;
* anything else (element-wise, reductions, copies, gathers): its floor is the bytes of its
  tensor inputs and of one output of its largest input's size (dtypes from the profiler) at the
  measured bandwidth. Bytes of ops whose shapes the profiler does not record count as 0, so the
  floor is a lower bound.

Printed: the measured time, the floor and their ratio per op name (largest first), the totals,
and the two bounds that matter: the matmul floor alone (no schedule of these matmuls can beat
it on this machine) and matmuls + one pass of every other op at full bandwidth.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

MATMUL = {"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::addbmm", "aten::matmul"}
SIZE = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8, "int": 4,
        "bool": 1, "unsigned char": 1, "signed char": 1, "short int": 2}


def measure_bandwidth(seconds: float = 1.0) -> float:
    """Bytes/s of a streaming float32 triad a = b + s * c (two reads, one write)."""
    import torch

    n = 32 * 2**20  # 128 MB per array
    b, c = torch.rand(n), torch.rand(n)
    a = torch.empty(n)
    best = float("inf")
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or best == float("inf"):
        t0 = time.perf_counter()
        torch.add(b, c, alpha=0.5, out=a)
        best = min(best, time.perf_counter() - t0)
    return 3 * 4 * n / best


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def op_bytes(evt) -> int:
    sizes = []
    for shape, dt in zip(evt.input_shapes or [], evt.input_dtypes or []):
        if isinstance(shape, (list, tuple)) and shape and all(isinstance(s, int) for s in shape):
            sizes.append(_numel(shape) * SIZE.get(dt, 4))
    return sum(sizes) + (max(sizes) if sizes else 0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", default="rl")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--data", default="")
    ap.add_argument("--init-from", default="")
    ap.add_argument("--set", action="append", default=[], help="config override key=value")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(args.threads)
    from rltok.bench import Bench, measure_matmul_peak, model_matmul_shapes

    over = dict(kv.split("=", 1) for kv in args.set)
    if args.data:
        over["data.source"] = args.data
    b = Bench(args.method, args.preset, overrides=over, device="cpu", init_from=args.init_from or None)
    for _ in range(3):
        b.step(record=False)
    dtype = b.step_fn.dtype.dtype  # train.dtype with auto resolved (rltok/precision.py)
    # the peak at the model's own matmul shapes (the best of them) and at a 1024^3 square
    square = measure_matmul_peak(torch.device("cpu"), dtype, 1.0)
    peak = max(square, measure_matmul_peak(torch.device("cpu"), dtype, 1.0, shapes=model_matmul_shapes(b.cfg)))
    bw = measure_bandwidth()
    # times from a plain profile (recording shapes adds per-op overhead), FLOPs and bytes from
    # a second one of the same number of steps
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as plain:
        for _ in range(args.steps):
            b.step()
    wall = (time.perf_counter() - t0) / args.steps
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as prof:
        for _ in range(args.steps):
            b.step()
    agg = defaultdict(lambda: {"calls": 0, "time": 0.0, "flops": 0.0, "bytes": 0.0})
    for e in plain.events():  # self time: it excludes the ops below, so nothing counts twice
        if e.name.startswith("aten::"):
            agg[e.name]["calls"] += 1
            agg[e.name]["time"] += e.self_cpu_time_total / 1e6

    def moved(e) -> int:
        """Bytes of the deepest ops below ``e`` that record shapes (a parent such as aten::to
        moves its bytes in its child copy_), else of ``e`` itself."""
        below = sum(moved(c) for c in e.cpu_children if c.name.startswith("aten::"))
        return below if below else op_bytes(e)

    for e in prof.events():
        if not e.name.startswith("aten::") or (e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::")):
            continue  # top-level aten ops only; moved() walks down
        if e.name in MATMUL:
            agg[e.name]["flops"] += float(e.flops or 0)
        else:
            agg[e.name]["bytes"] += moved(e)
    rows = []
    for name, a in agg.items():
        floor = a["flops"] / peak if name in MATMUL else a["bytes"] / bw
        rows.append({"op": name, "calls": a["calls"] / args.steps, "time_s": a["time"] / args.steps,
                     "floor_s": floor / args.steps, "flops": a["flops"] / args.steps,
                     "bytes": a["bytes"] / args.steps, "matmul": name in MATMUL})
    rows.sort(key=lambda r: -r["time_s"])
    mm_t = sum(r["time_s"] for r in rows if r["matmul"])
    mm_f = sum(r["floor_s"] for r in rows if r["matmul"])
    el_t = sum(r["time_s"] for r in rows if not r["matmul"])
    el_f = sum(r["floor_s"] for r in rows if not r["matmul"])
    print(f"{args.method} {args.preset}, {dtype}, {args.threads} thread(s): step {wall:.3f} s (profiled; the "
          f"profiler adds overhead), matmul peak {peak / 1e12:.3f} TFLOP/s (1024^3: {square / 1e12:.3f}), "
          f"triad bandwidth {bw / 1e9:.1f} GB/s")
    print()
    print("| op | calls/step | time s | floor s | time / floor |")
    print("|---|---|---|---|---|")
    for r in rows[:25]:
        ratio = r["time_s"] / r["floor_s"] if r["floor_s"] > 0 else float("inf")
        print(f"| {r['op']} | {r['calls']:.0f} | {r['time_s']:.4f} | {r['floor_s']:.4f} | {ratio:.1f} |")
    print()
    print(f"matmuls: {mm_t:.3f} s measured, {mm_f:.3f} s at the measured peak "
          f"({sum(r['flops'] for r in rows if r['matmul']) / 1e9:.1f} GFLOP/step)")
    print(f"everything else: {el_t:.3f} s measured, {el_f:.3f} s at the measured bandwidth")
    print(f"floor of this op sequence: {mm_f + el_f:.3f} s/step; matmul floor alone: {mm_f:.3f} s/step "
          f"(the step is {wall / max(mm_f, 1e-12):.2f}x the matmul floor)")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "step_s": wall, "matmul_peak": peak,
                                               "bandwidth": bw, "matmul_s": mm_t, "matmul_floor_s": mm_f,
                                               "other_s": el_t, "other_floor_s": el_f, "ops": rows},
                                              indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
