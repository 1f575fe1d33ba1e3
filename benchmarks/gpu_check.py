#!/usr/bin/env python
"""The checks that need a GPU, and the GPU throughput figures, in one run (see gpu_check.sh).

On CUDA:
  1. causality on the device: with the rl policy (w = 8) drawing its own boundaries, logits up to
     byte t do not change when later bytes change (fp32, TF32 off);
  2. bf16 autocast against fp32: the same model, inputs and boundaries; loss within 2%;
  3. the parallel w > 1 policy sampler on the device equals the sequential one on the CPU;
  4. sliding-window attention (blocked SDPA, and FlashAttention when installed) equals dense
     masked attention, in fp32 and bf16;
  5. throughput of the 147M preset, rl and uniform interleaved (bytes/s, model TFLOP/s, MFU
     against the data-sheet bf16 peak and the measured matmul peak, peak memory, step ratio),
     eager and then with per-block torch.compile if time is left.
Without CUDA it runs the same code on the CPU at smoke sizes (a fast self-test).
Prints one JSON line per result prefixed with "RESULT " and a summary; --json PATH saves them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from rltok.methods import get_method  # noqa: E402
from rltok.config import build_config  # noqa: E402

RESULTS: list[dict] = []
T0 = time.perf_counter()


JSON_PATH: list[Path] = []  # --json: rewritten after every result, so a run cut short keeps them
ENV: dict = {}


def report(name: str, ok: bool | None, **info) -> None:
    rec = {"check": name, "ok": ok, "elapsed_s": round(time.perf_counter() - T0, 1), **info}
    RESULTS.append(rec)
    print("RESULT " + json.dumps(rec), flush=True)
    for path in JSON_PATH:
        path.write_text(json.dumps({"env": ENV, "results": RESULTS}, indent=2))


def check_syncs(preset: str, device, base: dict | None = None) -> None:
    """Host syncs in one training step, two ways: rltok's counter (the op and line of each) and
    CUDA's own sync debug mode (a warning per synchronising call)."""
    import warnings

    from rltok.bench import count_step_syncs

    from rltok.bench import Bench
    from rltok.config import build_config as _bc
    from rltok.data import load_splits

    base = dict(base or {})
    splits = load_splits(_bc("rl", preset, overrides=base))
    for method in ("rl", "uniform"):
        for mode in ("auto", "off"):
            over = {**base, "model.static_chunks": mode, "train.micro_batch": 8 if device.type == "cuda" else 2,
                    "train.batch_size": 16 if device.type == "cuda" else 4}
            if device.type != "cuda":
                over["train.dtype"] = "fp32"
            res = count_step_syncs(method, preset, over, device=device.type, splits=splits)
            n_cuda, where = None, None
            if device.type == "cuda":
                b = Bench(method, preset, over, device.type, splits=splits)
                b.step(record=False)
                torch.cuda.synchronize()
                with warnings.catch_warnings(record=True) as w:
                    warnings.simplefilter("always")
                    torch.cuda.set_sync_debug_mode("warn")
                    try:
                        b.step_fn(1, b.cfg.train.lr)
                    finally:
                        torch.cuda.set_sync_debug_mode(0)
                hits = [x for x in w if "synchroniz" in str(x.message).lower()]
                n_cuda = len(hits)
                where = {}
                for x in hits:
                    k = f"{x.filename.split('/rltok/')[-1]}:{x.lineno}"
                    where[k] = where.get(k, 0) + 1
                del b
            report(f"syncs_{method}_{'static' if mode == 'auto' else 'dynamic'}",
                   (res.syncs <= 1) if mode == "auto" else None, preset=preset, micro_steps=2,
                   syncs=res.syncs, sites=res.sites, cuda_sync_warnings=n_cuda,
                   cuda_sync_sites=where if device.type == "cuda" else None)


def check_fullgraph(device, compare: tuple[str, ...] = ("rl",), base: dict | None = None) -> None:
    """The whole training loss (router, chunking, main network, dechunking, losses) under
    torch.compile(fullgraph=True): graph breaks by torch._dynamo.explain, then loss and
    gradients against eager."""
    from rltok.objectives import training_loss
    from rltok.data.loader import Batch  # noqa: F401  (the batch type the loss takes)
    from rltok.bench import Bench
    from rltok.syncs import force_accelerator_path

    for method in compare or ("rl", "uniform"):
        with force_accelerator_path():
            b = Bench(method, "tiny" if device.type == "cuda" else "smoke",
                      {"data.source": "stdlib", **(base or {}), "model.static_chunks": "on", "train.dtype": "fp32"},
                      device.type,
                      splits=SPLITS[0] if SPLITS else None)
            if not SPLITS:
                SPLITS.append(b.splits)
            batch = b.step_fn.dataset.batch(b.step_fn.indices(0)[: b.step_fn.layout.micro]).to(device)
            model, cfg = b.model, b.cfg

            def loss_fn(batch):
                return training_loss(model, batch, cfg).loss

            t = time.perf_counter()
            try:
                ex = torch._dynamo.explain(loss_fn)(batch)
                breaks = [f"{r.reason}" for r in ex.break_reasons][:12]
                n_breaks = ex.graph_break_count
            except Exception as e:  # report, do not stop the run
                breaks, n_breaks = [f"explain failed: {type(e).__name__}: {str(e)[:300]}"], None
            torch._dynamo.reset()
            info = dict(graph_breaks=n_breaks, reasons=breaks, explain_s=round(time.perf_counter() - t, 1))
            if n_breaks == 0 and method in compare:
                try:
                    torch.manual_seed(5)
                    eager = loss_fn(batch)
                    eager.backward()
                    ge = [p.grad.clone() for p in model.parameters() if p.grad is not None]
                    model.zero_grad()
                    comp = torch.compile(loss_fn, fullgraph=True)
                    torch.manual_seed(5)
                    lc = comp(batch)
                    lc.backward()
                    gc = [p.grad.clone() for p in model.parameters() if p.grad is not None]
                    rel = max(float((a - c).norm() / a.norm().clamp(min=1e-12)) for a, c in zip(ge, gc))
                    info.update(loss_eager=float(eager), loss_compiled=float(lc), grad_rel_diff_max=rel)
                except Exception as e:
                    info.update(compiled_error=f"{type(e).__name__}: {str(e)[:300]}")
            report(f"fullgraph_{method}{'_vs_eager' if compare else ''}", None if n_breaks is None else n_breaks == 0, **info)
            del b, model


SPLITS: list = []


def small_model(device, seq_len: int, window: int, **over):
    cfg = build_config("rl", "smoke", overrides={"model.seq_len": seq_len, "model.window": window,
                                                 "model.d_model": 64, "model.n_heads": 2,
                                                 "boundary.window": 8, "boundary.scale": 1.0, **over})
    torch.manual_seed(0)
    return get_method("rl").build(cfg, None).to(device).eval()


def check_causality(device, S: int) -> None:
    model = small_model(device, S, 32)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 256, (2, S), generator=g).to(device)
    noise = torch.rand(2, S, generator=g).to(device)
    with torch.no_grad():
        base = model(ids, noise=noise).logits
        worst = 0.0
        for t in (0, 7, S // 3, S // 2, S - 2):
            ids2 = ids.clone()
            ids2[:, t + 1:] = torch.randint(0, 256, (2, S - t - 1), generator=g).to(device)
            out = model(ids2, noise=noise).logits
            worst = max(worst, float((out[:, :t + 1] - base[:, :t + 1]).abs().max()))
    report("causality", worst <= 1e-4, max_abs_diff=worst, seq_len=S)


def check_bf16_parity(device, S: int) -> None:
    model = small_model(device, S, 32)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 256, (4, S), generator=g).to(device)
    b = torch.rand(4, S, generator=g).to(device) < 0.2
    tgt = torch.roll(ids, -1, 1)
    with torch.no_grad():
        f32 = model(ids, boundaries=b).logits.float()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            bf = model(ids, boundaries=b).logits.float()
    l32 = F.cross_entropy(f32.reshape(-1, f32.shape[-1]), tgt.reshape(-1))
    lbf = F.cross_entropy(bf.reshape(-1, bf.shape[-1]), tgt.reshape(-1))
    rel = float((lbf - l32).abs() / l32)
    report("bf16_vs_fp32", rel < 0.02, loss_fp32=float(l32), loss_bf16=float(lbf), rel_diff=rel,
           max_abs_logit_diff=float((bf - f32).abs().max()))


def check_scan(device, B: int, S: int) -> None:
    policy = small_model(device, S, 32).boundary
    g = torch.Generator().manual_seed(3)
    V = torch.randn(B, S, 8, generator=g) * 2
    u = torch.rand(B, S, generator=g)
    valid = torch.ones(B, S, dtype=torch.bool)
    valid[0, S // 2:] = False
    policy_cpu = small_model(torch.device("cpu"), S, 32).boundary
    ref = policy_cpu._scan_sequential(V, u, valid, False)
    t = time.perf_counter()
    out = policy._scan_parallel(V.to(device), u.to(device), valid.to(device), False)
    if device.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t
    mism = int((out.cpu() != ref).sum())
    report("policy_scan_parallel", mism == 0, mismatches=mism, B=B, S=S, seconds=round(dt, 4))


def check_attention(device, T: int, W: int) -> None:
    from rltok.model import layers

    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 4, T, 64, generator=g).to(device) for _ in range(3))
    i = torch.arange(T, device=device)[:, None]
    j = torch.arange(T, device=device)[None, :]
    mask = (j <= i) & (j > i - W)
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        qq, kk, vv = q.to(dtype), k.to(dtype), v.to(dtype)
        ref = F.scaled_dot_product_attention(qq.float(), kk.float(), vv.float(), attn_mask=mask)
        out = layers.local_attention(qq, kk, vv, W).float()
        err = float((out - ref).abs().max())
        report(f"local_attention_{str(dtype).split('.')[-1]}", err <= tol, max_abs_diff=err, T=T, W=W)
        if layers.flash_available() and dtype == torch.bfloat16 and device.type == "cuda":
            fa = layers._flash_attn_func(qq.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2),
                                         causal=True, window_size=(W - 1, 0)).transpose(1, 2).float()
            err = float((fa - ref).abs().max())
            report("flash_attention_window_bf16", err <= tol, max_abs_diff=err, T=T, W=W)


def bench(preset: str, steps: int, warmup: int, device: str, compile_: bool, overrides: dict, tag: str = "") -> None:
    from rltok.bench import format_table, run_interleaved

    over = dict(overrides)
    if compile_:
        over["train.compile"] = True
    t = time.perf_counter()
    rl, uni = run_interleaved(["rl", "uniform"], preset, steps=steps, warmup=warmup, overrides=over,
                              device=device, progress=False, peak_seconds=1.0 if device == "cuda" else 0.2)
    print(format_table([rl, uni]), flush=True)
    import statistics

    ratio = statistics.median(a / b for a, b in zip(rl.times, uni.times))
    for r in (rl, uni):
        report(f"bench_{r.method}{'_compiled' if compile_ else ''}{tag}", None, preset=preset,
               bytes_per_s=round(r.bytes_per_s), step_s=round(r.step_s, 4), rate=round(r.rate, 4),
               model_tflops=round(r.model_flops_per_s / 1e12, 2),
               mfu=round(r.mfu, 4) if r.mfu is not None else None, peak=r.peak_source,
               mfu_vs_measured_matmul=round(r.mfu_vs_measured, 4) if r.mfu_vs_measured else None,
               measured_matmul_tflops=round((r.matmul_peak_measured or 0) / 1e12, 1),
               peak_memory_gb=round(r.peak_memory_bytes / 2**30, 2), seconds=round(time.perf_counter() - t, 1))
    # performance targets are reported, not failed on (ok=None): the exit status is correctness
    report(f"rl_over_uniform{'_compiled' if compile_ else ''}{tag}", None, ratio=round(ratio, 4),
           ratio_target_met=ratio <= 1.10, mfu_rl=round(rl.mfu, 4) if rl.mfu is not None else None,
           mfu_target_met=bool(rl.mfu is not None and rl.mfu >= 0.40))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default=None, help="bench preset (default: 147M on CUDA, smoke on CPU)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per method")
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--budget-s", type=float, default=420, help="skip the compiled bench past this")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile bench")
    ap.add_argument("--no-fullgraph", action="store_true", help="skip the whole-loss fullgraph compile check")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--json", default=None, help="write all results to this JSON file")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda") if cuda else torch.device("cpu")
    over = dict(s.split("=", 1) for s in args.overrides)
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name() if cuda else "cpu"}
    from rltok.model import layers

    env["flash_attn"] = layers.flash_available()
    ENV.update(env)
    if args.json:
        JSON_PATH.append(Path(args.json))
    print("gpu_check " + json.dumps(env), flush=True)
    if not cuda:
        print("no CUDA device: CPU fallback at smoke sizes (a self-test of this script)", flush=True)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    S = 1024 if cuda else 96
    check_causality(device, S)
    check_bf16_parity(device, S)
    check_scan(device, 8 if cuda else 2, 4096 if cuda else 128)
    check_attention(device, 4096 if cuda else 100, 64 if cuda else 16)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    preset = args.preset or ("147M" if cuda else "smoke")
    steps = args.steps or (10 if cuda else 2)
    warmup = args.warmup if args.warmup is not None else (3 if cuda else 1)
    if not cuda:
        over.setdefault("train.dtype", "fp32")
    check_syncs(preset if cuda else "smoke", device, over)
    bench(preset, steps, warmup, device.type, False, over)
    if cuda:  # the same, with dynamic chunk shapes (one host sync per micro-step)
        bench(preset, steps, warmup, device.type, False, {**over, "model.static_chunks": "off"}, tag="_dynamic")
    if not args.no_fullgraph:  # graph breaks only (cheap); compiling and comparing comes last
        check_fullgraph(device, compare=(), base=over)
    if cuda and not args.no_compile:
        if time.perf_counter() - T0 < args.budget_s * 0.5:
            bench(preset, steps, warmup, device.type, True, over)
        else:
            report("bench_compiled", None, skipped="not enough time left in the budget")
    if not args.no_fullgraph and time.perf_counter() - T0 < args.budget_s * 0.7:
        check_fullgraph(device, compare=("rl",), base=over)
    failed = [r["check"] for r in RESULTS if r["ok"] is False]
    print(f"gpu_check: {len(RESULTS)} results, {len(failed)} failed{': ' + ', '.join(failed) if failed else ''}; "
          f"{time.perf_counter() - T0:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
