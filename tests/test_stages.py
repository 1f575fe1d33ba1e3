"""The recursive stage at any depth (issue 37): index arithmetic across three levels by hand, a
three-level U-Net's training loss (every level's estimator, every parameter learns), cached
decoding equal to the full forward pass at every level, and checkpoints written before stages
were recursive (flat parameter names, format 10) loading into the recursive layout unchanged.
Two levels: test_two_stage.py; identical numbers before and after: test_golden_stages.py."""

import json
from pathlib import Path

import pytest
import torch

from rltok.config import build_config
from rltok.generate import prefill, step
from rltok.methods import get_method
from rltok.model.chunking import chunk_indices
from rltok.model.router import BoundaryOutput
from rltok.model.stage import StageOutput, level_boundary_bytes
from rltok.schema import BOS, PAD

KEYS = json.loads((Path(__file__).parent / "data" / "format10_keys.json").read_text())


def _cfg(stages=3, **over):
    return build_config("rl", "smoke", overrides={"model.stages": stages, "model.seq_len": 96, "model.window": 8,
                                                   "model.chunk_pad_multiple": 1, "model.inner_enc_layers": 1,
                                                   "model.inner_dec_layers": 1, **over})


def _model(stages=3, **over):
    cfg = _cfg(stages, **over)
    torch.manual_seed(0)
    m = get_method("rl").build(cfg, None)
    with torch.no_grad():  # sharper than the init, so that outputs and decisions depend on inputs
        for p in m.parameters():
            if p.dim() >= 2:
                p.mul_(3.0)
    return m.eval()


def _level(b: list[int], pad_to: int | None = None) -> StageOutput:
    bt = torch.tensor([b], dtype=torch.bool)
    return StageOutput(y=None, h=None, boundary=BoundaryOutput(hard=bt.float(), decided=bt),
                       chunks=chunk_indices(bt, pad_to or 1), zhat=None)


def test_level_ends_carried_to_the_bytes_by_hand():
    """Bytes 0..9, byte-level chunks ending at bytes (0, 3, 7, 9); level 1 decides (1, 0, 1, 1) over
    those 4 chunks: its chunks end at byte-level chunks 0, 2, 3, i.e. at bytes 0, 7, 9; level 2
    decides (1, 0, 1) over those 3: its chunks end at level-1 chunks 0 and 2, i.e. at bytes 0 and 9."""
    l0, l1, l2 = _level([1, 0, 0, 1, 0, 0, 0, 1, 0, 1]), _level([1, 0, 1, 1]), _level([1, 0, 1])
    l0.inner, l1.inner = l1, l2
    ends1, ends2 = level_boundary_bytes(l0, 10)
    assert ends1[0].nonzero().flatten().tolist() == [0, 7, 9]
    assert ends2[0].nonzero().flatten().tolist() == [0, 9]


def test_three_levels_train_every_router_and_report_every_rate():
    from rltok.data.loader import Batch
    from rltok.evaluate import level_rates
    from rltok.objectives import ratios, training_loss

    cfg = _cfg(3, **{"model.seq_len": 64})
    torch.manual_seed(0)
    model = get_method("rl").build(cfg, None)
    assert len(model.routers) == 3 and model.stage.depth == 3
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 256, (4, 64), generator=g)
    ids[:, 0] = BOS
    batch = Batch(ids=ids, targets=torch.randint(0, 256, (4, 64), generator=g),
                  noise=torch.rand(4, 64, generator=g), index=torch.arange(4))
    sl = training_loss(model, batch, cfg)
    sl.loss.backward()
    assert [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()] == []
    for k in ("inner_pg_loss", "inner2_pg_loss", "bpb_skip", "bpb_skip2", "n_inner_boundary", "n_inner2_boundary"):
        assert k in sl.stats, k
    r = ratios({k: v for k, v in sl.stats.items() if k.startswith("n_")})
    rates = level_rates(r)
    assert len(rates) == 3 and all(0 < x <= 1 for x in rates)
    assert r["bytes_per_inner2_chunk"] >= r["bytes_per_inner_chunk"] >= 1 / r["rate"]


@pytest.mark.parametrize("mode", ["sample", "greedy"])
def test_three_level_cached_decoding_matches_the_full_forward_pass(mode):
    """As test_two_stage's parity test, three levels deep: prompts of different lengths, one step
    per byte, a row dropped midway; every log-probability and byte-level decision equals the full
    forward pass's, and the deepest level does decide something."""
    model = _model(3)
    g = torch.Generator().manual_seed(1)
    N = 30
    prompt_lens = [1, 11, 3, 20]
    seqs = [[BOS] + torch.randint(0, 256, (L + N - 1,), generator=g).tolist() for L in prompt_lens]
    width = max(map(len, seqs)) + 1
    noise = torch.rand(4, width, generator=g)
    pre = prefill(model, [s[:L] for s, L in zip(seqs, prompt_lens)], noise=noise, mode=mode)
    state = pre.state
    rows = list(range(4))
    got = {r: [torch.log_softmax(pre.logits[r].float(), -1)] for r in rows}
    decided = {r: [] for r in rows}
    for k in range(N):
        if k == N // 2:
            rows = rows[1:]
            state = state.select(torch.arange(1, 4))
        pos = state.pos
        ids = torch.tensor([seqs[r][p] for r, p in zip(rows, pos.tolist())])
        out = step(model, state, ids, noise=noise[rows, pos], mode=mode)
        for j, r in enumerate(rows):
            got[r].append(torch.log_softmax(out.logits[j].float(), -1))
            decided[r].append(bool(out.boundary.b[j]))
    deepest_any = False
    for r, L in enumerate(prompt_lens):
        n = len(got[r])
        ids = torch.tensor([seqs[r][: L - 1 + n] + [PAD]])
        with torch.no_grad():
            full = model(ids, noise=noise[r: r + 1, : ids.shape[1]], mode=mode,
                         valid=torch.ones_like(ids, dtype=torch.bool))
        ref = torch.log_softmax(full.logits[0].float(), -1)[L - 1: L - 1 + n]
        torch.testing.assert_close(torch.stack(got[r]), ref, atol=2e-5, rtol=0)
        assert full.boundary.b[0, L: L - 1 + n].tolist() == decided[r][: n - 1]
        deepest_any |= bool(level_boundary_bytes(full.stage, ids.shape[1])[1][0, 1:-1].any())
    assert deepest_any


@pytest.mark.parametrize("name", sorted(KEYS))
def test_checkpoints_with_flat_names_load_into_the_recursive_layout(name):
    """The parameter names a format-10 checkpoint has (recorded from that code), holding this
    model's tensors in their order, load strictly and give back the same tensors."""
    method = "rl" if name.startswith("rl") else name
    over = {"model.stages": 2, "model.inner_enc_layers": 1, "model.inner_dec_layers": 1} if "two" in name else {}
    torch.manual_seed(0)
    model = get_method(method).build(build_config(method, "smoke", overrides=over), None)
    sd = model.state_dict()
    assert len(sd) == len(KEYS[name])
    old = {k: v.clone() + 1 for k, v in zip(KEYS[name], sd.values())}  # order unchanged, names flat
    model.load_state_dict(old, strict=True)
    for (k, v), want in zip(model.state_dict().items(), old.values()):
        assert torch.equal(v, want), k
