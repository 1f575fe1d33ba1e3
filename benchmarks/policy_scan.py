"""The w > 1 policy's sequential sampling scan on CPU: rltok's numpy loop against the torch loop
it replaced (kept here, verbatim in behaviour), side by side in one process, same inputs, with
their decisions compared. Issue 15 item 5 (the scan was ~2x slower than the reference's).

    python benchmarks/policy_scan.py [--batch 16] [--seq 512] [--window 8] [--threads 1] [--reps 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rltok.config import build_config
from rltok.run import build_model


@torch.no_grad()
def torch_loop(policy, V, u, valid, greedy):
    """The previous implementation: one torch op sequence per byte."""
    B, S, w = V.shape
    coef, bias = V[..., : w - 1], V[..., w - 1]
    win = V.new_zeros(B, w - 1)
    out = torch.zeros(B, S, dtype=torch.bool)
    for t in range(S):
        if t == 0 or t == S - 1:
            bt = torch.ones(B, dtype=torch.bool)
        else:
            lt = policy._cap(policy.cfg.scale * (bias[:, t] + (coef[:, t] * win).sum(-1)) + policy.bias0)
            bt = (lt > 0) if greedy else (u[:, t] < torch.sigmoid(lt))
            bt = bt & valid[:, t]
        out[:, t] = bt
        win = torch.cat([win[:, 1:], bt[:, None].to(win.dtype)], dim=1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    policy = build_model(build_config("rl", "tiny", overrides={"boundary.window": a.window})).boundary.train()
    g = torch.Generator().manual_seed(0)
    V = torch.randn(a.batch, a.seq, a.window, generator=g) * 2
    u = torch.rand(a.batch, a.seq, generator=g)
    valid = torch.ones(a.batch, a.seq, dtype=torch.bool)
    ref, new = torch_loop(policy, V, u, valid, False), policy._scan_sequential(V, u, valid, False)
    mism = int((ref != new).sum())
    ratios, t_old, t_new = [], [], []
    for _ in range(a.reps):  # alternate, so load on the machine hits both alike
        t0 = time.perf_counter(); torch_loop(policy, V, u, valid, False); t1 = time.perf_counter()
        policy._scan_sequential(V, u, valid, False); t2 = time.perf_counter()
        t_old.append(t1 - t0); t_new.append(t2 - t1); ratios.append((t1 - t0) / (t2 - t1))
    print(f"B={a.batch} S={a.seq} w={a.window} threads={a.threads}: torch loop {statistics.median(t_old) * 1e3:.1f} ms, "
          f"numpy loop {statistics.median(t_new) * 1e3:.1f} ms, speed-up median {statistics.median(ratios):.2f}x "
          f"(range {min(ratios):.2f}-{max(ratios):.2f}); decisions differing: {mism} of {ref.numel()}")


if __name__ == "__main__":
    main()
