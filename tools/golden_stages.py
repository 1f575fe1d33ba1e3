"""Fingerprints of the U-Net's outputs on fixed weights, for the recursive-stage redesign (issue 37):
``python tools/golden_stages.py write`` records them (tests/data/golden_stages.json) with the code
of the day; tests/test_golden_stages.py recomputes them and asserts they are identical: the
initialisation from a seed (parameter sums in registration order), the training loss, its
statistics and gradients, the boundaries sampled and greedy at every level, and bytes generated
with the caches, for one- and two-stage U-Nets and the stage parts of each family."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

GOLDEN = Path(__file__).resolve().parent.parent / "tests" / "data" / "golden_stages.json"
S = 48
TEXT = (b"The city council met on Tuesday to discuss the new park. Members of the public spoke "
        b"for an hour, and the vote was postponed until the spring.")
TWO = {"model.stages": 2, "model.inner_enc_layers": 1, "model.inner_dec_layers": 1}
VARIANTS: dict[str, tuple[str, dict]] = {
    "rl": ("rl", {}),
    "rl-deviation": ("rl", {"dechunker.upsample": "deviation"}),
    "rl-two-stage": ("rl", TWO),
    "rl-two-stage-early": ("rl", {**TWO, "boundary.inner_baseline": "early"}),
    "nawrot": ("nawrot", {}),
    "hnet": ("hnet", {}),
    "whitespace": ("whitespace", {}),
}


def _batch(B: int = 2):
    from rltok.data.loader import Batch
    from rltok.schema import BOS

    ids = torch.full((B, S), BOS, dtype=torch.long)
    for r in range(B):
        seq = [BOS] + list(TEXT[r * 7: r * 7 + S - 1])
        ids[r, : len(seq)] = torch.tensor(seq)
    targets = torch.cat([ids[:, 1:], torch.full((B, 1), -1)], 1)
    g = torch.Generator().manual_seed(1)
    noise = torch.rand(B, S, generator=g)
    return Batch(ids=ids, targets=targets, noise=noise, index=torch.arange(B))


def _f(x) -> float:
    return float(x.detach().double().sum()) if isinstance(x, torch.Tensor) else float(x)


def _levels(out) -> list[list[list[int]]]:
    """The boundaries at every level, each as row lists of 0/1 over its own axis."""
    return [level.boundary.b.int().tolist() for level in out.levels]


def fingerprint(name: str) -> dict:
    from rltok.config import build_config
    from rltok.generate import generate
    from rltok.methods import get_method
    from rltok.objectives import training_loss

    method, over = VARIANTS[name]
    cfg = build_config(method, "smoke", overrides={"model.seq_len": S, "model.window": 8,
                                                    "model.chunk_pad_multiple": 1, **over})
    torch.manual_seed(0)
    model = get_method(method).build(cfg, None)
    init = [_f(p) for p in model.parameters()]
    with torch.no_grad():  # sharper than the init, so that outputs and decisions depend on inputs
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(3.0)
    batch = _batch()
    model.train()
    sl = training_loss(model, batch, cfg)
    sl.loss.backward()
    grads = [_f(p.grad) if p.grad is not None else None for p in model.parameters()]
    model.eval()
    with torch.no_grad():
        sampled = model(batch.ids, noise=batch.noise, mode="sample")
        greedy = model(batch.ids, mode="greedy")
    res = generate(model, [b"The city", b"Members of"], 24, temperature=0.8, seed=3)
    return {"init": init, "loss": _f(sl.loss), "stats": {k: _f(v) for k, v in sorted(sl.stats.items())},
            "grads": grads, "sampled": _levels(sampled), "sampled_logits": _f(sampled.logits),
            "greedy": _levels(greedy), "greedy_logits": _f(greedy.logits),
            "generated": [r.text for r in res]}


def main() -> None:
    torch.set_num_threads(1)
    if sys.argv[1:] == ["write"]:
        GOLDEN.write_text(json.dumps({n: fingerprint(n) for n in VARIANTS}, indent=1) + "\n")
        print(f"wrote {GOLDEN}")
    else:
        print(__doc__)


if __name__ == "__main__":
    main()
