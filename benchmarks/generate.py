"""Decode speed and memory: KV-cached incremental decoding vs re-running the full forward pass
for every byte, on the ``tiny`` preset (or a trained run).

For each context length C and batch size B, every row gets C-1 bytes of real text as its prompt
(BOS + C-1 = C positions of context), then:

* cached: ``generate`` (prefill once, then one step per byte) for ``--new-bytes`` bytes;
* re-run: ``generate(cache=False)`` for ``--rerun-bytes`` bytes (each byte is a full forward
  pass over everything so far, what the paper's reference code and BLT do).

Reported per configuration: time to first byte (prefill + first byte), time per decode step
(one byte for every row), throughput (bytes/s summed over the batch), the speed-up of cached over
re-run per byte, and the cache memory: byte layers (a ring of ``window`` entries per layer: does
not grow with the context), main network (entries per chunk) and, for scale, what a plain KV
cache over every byte of every layer would hold.

Speed does not depend on the weights, so without ``--run`` the model is a tiny-preset model
with random weights and ``model.seq_len`` set to the longest context (the ``tiny`` preset
trains at 512). Random weights still decide boundaries at the target rate (the policy's bias is
logit(r*)), so the chunk counts are realistic; their end-of-document logit is set to -1e4 so
that no row stops early and the batch stays full. Cached decoding runs ``--repeats`` times and
the fastest run is reported (shared machines are noisy); re-running runs once.

    python benchmarks/generate.py                           # the full table (several minutes)
    python benchmarks/generate.py --contexts 256 --batches 1 --new-bytes 16 --rerun-bytes 2  # quick check
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rltok.methods import get_method  # noqa: E402
from rltok.schema import BOS
from rltok.config import build_config  # noqa: E402
from rltok.generate import generate  # noqa: E402

C4 = REPO.parent / "shared" / "data" / "webtext" / "c4" / "c4_sample.jsonl"


def prompt_text(n_bytes: int, rows: int) -> list[bytes]:
    """``rows`` different real-text prompts of exactly ``n_bytes`` bytes."""
    if C4.is_file():
        with open(C4, "rb") as f:
            blob = b"\n".join(json.loads(line)["text"].encode("utf-8") for _, line in zip(range(4000), f))
    else:  # no shared data: this repository's own source is real text too
        blob = b"\n".join(p.read_bytes() for p in sorted((REPO / "rltok").rglob("*.py")))
    while len(blob) < n_bytes * rows:
        blob = blob + blob
    return [blob[r * n_bytes:(r + 1) * n_bytes] for r in range(rows)]


def build_model(args, max_context: int):
    if args.run:
        from rltok.run import load_model

        model = load_model(args.run, device=args.device)
        return model, f"run {args.run}"
    cfg = build_config(args.method, "tiny", overrides={"model.seq_len": max(512, max_context), **dict(
        s.split("=", 1) for s in args.set)})
    torch.manual_seed(0)
    model = get_method(args.method).build(cfg, None).to(args.device).eval()
    with torch.no_grad():  # random weights predict end of document once in ~257 bytes: forbid it
        model.head.bias[BOS] = -1e4  # so that every row decodes all its bytes and B stays B
    return model, f"tiny preset, {args.method}, random weights, seq_len {cfg.model.seq_len}"


def plain_kv_bytes(model, batch: int, positions: int) -> int:
    """A KV cache over every byte for every layer (what a byte-level Transformer would hold)."""
    layers = sum(isinstance(m, Block) for m in model.modules())
    return 2 * layers * batch * positions * model.cfg.d_model * 4


def bench(model, context: int, batch: int, args) -> dict:
    prompts = prompt_text(context - 1, batch)
    kw = dict(temperature=1.0, seed=0, dtype=args.dtype, max_prompt_bytes=context - 1)
    generate(model, prompts, 2, **kw)  # warm-up (allocator, kernels)
    runs = [generate(model, prompts, args.new_bytes, **kw) for _ in range(args.repeats)]
    cached = min(runs, key=lambda r: r.decode_s / max(r.decode_bytes, 1))  # least disturbed run
    cached.ttfb_s = min(r.ttfb_s for r in runs)
    steps = cached.decode_bytes / batch
    row = {
        "context": context, "batch": batch,
        "cached_ttfb_ms": cached.ttfb_s * 1e3,
        "cached_step_ms": cached.decode_s / max(steps, 1) * 1e3,
        "cached_bytes_per_s": cached.bytes_per_s,
        "chunks_per_row": sum(int(g.boundaries.sum()) for g in cached) / batch,
        "cache_byte_layers_MiB": cached.cache_bytes.get("byte_layers", 0) / 2**20,
        "cache_main_used_MiB": cached.cache_bytes.get("main_used", 0) / 2**20,
        "cache_main_alloc_MiB": cached.cache_bytes.get("main_allocated", 0) / 2**20,
        "plain_kv_MiB": plain_kv_bytes(model, batch, context + args.new_bytes) / 2**20,
    }
    if args.rerun_bytes > 0:
        rerun = generate(model, prompts, args.rerun_bytes + 1, cache=False, **kw)
        rsteps = rerun.decode_bytes / batch
        row.update({
            "rerun_ttfb_ms": rerun.ttfb_s * 1e3,
            "rerun_step_ms": rerun.decode_s / max(rsteps, 1) * 1e3,
            "rerun_bytes_per_s": rerun.bytes_per_s,
        })
        row["speedup"] = row["rerun_step_ms"] / row["cached_step_ms"]
    return row


def markdown(rows: list[dict]) -> str:
    head = ("| context | batch | first byte (ms) | cached ms/step | cached bytes/s | re-run ms/step | "
            "re-run bytes/s | speed-up | chunks/row | cache: byte layers / main used (alloc) MiB | plain KV MiB |")
    lines = [head, "|" + "|".join(["---"] * 11) + "|"]
    for r in rows:
        lines.append(
            f"| {r['context']} | {r['batch']} | {r['cached_ttfb_ms']:.0f} | {r['cached_step_ms']:.2f} | "
            f"{r['cached_bytes_per_s']:.0f} | {r.get('rerun_step_ms', float('nan')):.0f} | "
            f"{r.get('rerun_bytes_per_s', float('nan')):.1f} | {r.get('speedup', float('nan')):.0f}x | "
            f"{r['chunks_per_row']:.0f} | {r['cache_byte_layers_MiB']:.2f} / {r['cache_main_used_MiB']:.2f} "
            f"({r['cache_main_alloc_MiB']:.2f}) | {r['plain_kv_MiB']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", default=None, help="a trained run (default: tiny preset, random weights)")
    p.add_argument("--method", default="rl", help="boundary method of the random-weight model")
    p.add_argument("--set", action="append", default=[], help="config override for the random-weight model")
    p.add_argument("--contexts", default="512,2048", help="context lengths in bytes (BOS included)")
    p.add_argument("--batches", default="1,8", help="batch sizes")
    p.add_argument("--new-bytes", type=int, default=128, help="bytes decoded per row with the cache")
    p.add_argument("--rerun-bytes", type=int, default=8, help="bytes decoded per row by re-running (0: skip)")
    p.add_argument("--repeats", type=int, default=2, help="cached runs per configuration; the fastest is reported")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--json", default=None, help="also write the rows as JSON lines to this file")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    contexts = [int(x) for x in args.contexts.split(",")]
    batches = [int(x) for x in args.batches.split(",")]
    model, what = build_model(args, max(contexts))
    print(f"# {what}; device {args.device}, {args.dtype}, {torch.get_num_threads()} thread(s), "
          f"torch {torch.__version__}, {platform.processor() or platform.machine()}; "
          f"{args.new_bytes} cached / {args.rerun_bytes} re-run bytes per row", flush=True)
    rows = []
    for c in contexts:
        for b in batches:
            t = time.perf_counter()
            r = bench(model, c, b, args)
            rows.append(r)
            print(f"#   context {c}, batch {b}: {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps({**r, "model": what, "threads": torch.get_num_threads()}) + "\n")
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
