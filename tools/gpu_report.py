#!/usr/bin/env python
"""The GPU run's records (results/gpu/*.json) as markdown tables, beside the memory model's
predictions (rltok plan) for the same shapes: prints them, and writes results/gpu/tables.md.

    python tools/gpu_report.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
GPU = REPO / "results" / "gpu"


def _results() -> tuple[dict, dict[str, dict]]:
    env, out = {}, {}
    for name in ("gpu_check.json", "gpu_check2.json"):
        p = GPU / name
        if p.is_file():
            d = json.loads(p.read_text())
            env = env or d["env"]
            for r in d["results"]:
                out[r["check"]] = {**r, "file": name}
    return env, out


def throughput_table(res: dict[str, dict]) -> list[str]:
    rows = [("eager, static chunk shapes", ""), ("eager, dynamic chunk shapes", "_dynamic"),
            ("per-block torch.compile", "_compiled"), ("whole loss, torch.compile(fullgraph=True)", "_fullgraph")]
    lines = ["| step | method | s/step | bytes/s | rate | model TFLOP/s | MFU (data sheet) | MFU (measured matmul) "
             "| peak memory GiB | rl / uniform |", "|---|---|---|---|---|---|---|---|---|---|"]
    for label, tag in rows:
        ratio = res.get(f"rl_over_uniform{tag}", {}).get("ratio")
        for m in ("rl", "uniform"):
            r = res.get(f"bench_{m}{tag}")
            if r is None:
                continue
            lines.append(f"| {label} | {m} | {r['step_s']:.3f} | {r['bytes_per_s']:,} | {r['rate']:.3f} | "
                         f"{r['model_tflops']:.1f} | {r['mfu']:.1%} | {r['mfu_vs_measured_matmul']:.1%} | "
                         f"{r['peak_memory_gb']:.2f} | {f'{ratio:.3f}' if m == 'rl' and ratio else ''} |")
    return lines


def checks_table(res: dict[str, dict]) -> list[str]:
    lines = ["| check | ok | figures |", "|---|---|---|"]
    for name, r in res.items():
        if name.startswith(("bench_", "rl_over_uniform")):
            continue
        figs = {k: v for k, v in r.items() if k not in ("check", "ok", "elapsed_s", "file", "reasons")}
        text = ", ".join(f"{k}={json.dumps(v)}" for k, v in figs.items())
        lines.append(f"| {name} ({r['file']}) | {r['ok']} | {text} |")
    return lines


def memory_rows(res: dict[str, dict]) -> list[str]:
    from rltok.config import build_config
    from rltok.plan import memory_plan

    cfg = build_config("rl", "147M")
    p = memory_plan(cfg, gpus=1, micro_batch=cfg.train.micro_batch)
    lines = ["| step | measured peak GiB | predicted GiB (rltok plan, 1 GPU, micro-batch "
             f"{p.micro_batch}) | predicted / measured |", "|---|---|---|---|"]
    for label, tag in (("eager, static", ""), ("eager, dynamic", "_dynamic"), ("per-block compile", "_compiled"),
                       ("fullgraph", "_fullgraph")):
        r = res.get(f"bench_rl{tag}")
        if r:
            lines.append(f"| {label} | {r['peak_memory_gb']:.2f} | {p.peak_bytes / 2**30:.2f} | "
                         f"{p.peak_bytes / 2**30 / r['peak_memory_gb']:.3f} |")
    return lines, p


def generate_table() -> list[str]:
    p = GPU / "generate.jsonl"
    if not p.is_file():
        return []
    lines = ["| context | batch | cached ms/step | cached bytes/s | re-run ms/step | speed-up |", "|---|---|---|---|---|---|"]
    for line in p.read_text().splitlines():
        r = json.loads(line)
        lines.append(f"| {r['context']} | {r['batch']} | {r['cached_step_ms']:.2f} | {r['cached_bytes_per_s']:,.0f} | "
                     f"{r['rerun_step_ms']:.1f} | {r['speedup']:.1f}x |")
    return lines


def main() -> int:
    env, res = _results()
    mem, plan = memory_rows(res)
    text = "\n".join([
        f"Device: {env.get('device')}, torch {env.get('torch')}, CUDA {env.get('cuda')}, "
        f"flash-attn installed: {env.get('flash_attn')}. `147M` preset, bf16 autocast, 128 x 4,096 bytes per step "
        "(16 micro-batches of 8), random weights at the target rate.", "",
        "### Throughput", "", *throughput_table(res), "",
        "### Memory against the model", "", *mem, "",
        "### Cached decoding (tiny preset, random weights)", "", *generate_table(), "",
        "### Checks", "", *checks_table(res), ""])
    (GPU / "tables.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
