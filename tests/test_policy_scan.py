"""The parallel sampler of the windowed policy (w > 1) against the sequential reference."""

import pytest
import torch

from rltok.methods import get_method
from rltok.boundaries.policy import scan_decisions
from rltok.config import build_config


def test_scan_decisions_hand_worked():
    # w = 2: the history is the previous decision. d[t][s]: decision at t after decision s.
    d = torch.tensor([[[1, 1], [0, 1], [1, 0], [1, 1]]], dtype=torch.bool)  # (1, 4, 2)
    # t0: s=0 -> 1; t1: s=1 -> 1; t2: s=1 -> 0; t3: s=0 -> 1
    assert scan_decisions(d).tolist() == [[True, True, False, True]]
    # w = 3: history bits (b_{t-2}, b_{t-1}) = (bit 0, bit 1); decide 1 iff exactly one of them is 1
    S = 9
    s = torch.arange(4)
    rule = ((s & 1) ^ (s >> 1)).bool()
    d = rule.expand(1, S, 4).clone()
    d[:, 0] = True  # b0 forced
    # b0=1; t1: hist (0,1) -> 1; t2: (1,1) -> 0; t3: (1,0) -> 1; t4: (0,1) -> 1; t5: (1,1) -> 0 ...
    assert scan_decisions(d).long().tolist() == [[1, 1, 0, 1, 1, 0, 1, 1, 0]]


@pytest.mark.parametrize("w", [2, 3, 8])
@pytest.mark.parametrize("greedy", [False, True])
def test_parallel_sampling_equals_sequential(w, greedy):
    cfg = build_config("rl", "smoke", overrides={"boundary.window": w, "boundary.scale": 1.0})
    policy = get_method("rl").build(cfg, None).boundary
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        B, S = 3, 200
        V = torch.randn(B, S, w, generator=g) * 2
        u = torch.rand(B, S, generator=g)
        valid = torch.ones(B, S, dtype=torch.bool)
        valid[1, 150:] = False  # padding
        a = policy._scan_parallel(V, u, valid, greedy)
        b = policy._scan_sequential(V, u, valid, greedy)
        assert torch.equal(a, b), (seed, int((a != b).sum()))
        assert a[:, 0].all() and a[:, -1].all() and not a[1, 150:-1].any()
