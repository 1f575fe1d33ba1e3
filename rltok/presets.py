"""Named presets (model size and optimisation) and recipes (bundles of settings), as plain data:
the command line lists them without importing torch or the methods (``rltok.config`` applies them)."""

from __future__ import annotations

from typing import Any

# ----------------------------------------------------------------------------------------------
# Presets: model size and optimisation. Paper sizes from the spec (section 1.4 and section 5).

_PAPER_OPT = {  # lr, batch (sequences of 4096 bytes), training bytes  (spec section 5)
    "18M": (3.6e-3, 32, 8.3e8),
    "32M": (3e-3, 64, 1.5e9),
    "40M": (3e-3, 64, 1.5e9),
    "73M": (2.4e-3, 128, 3.4e9),
    "130M": (2e-3, 128, 6e9),
    "147M": (1.5e-3, 128, 6e9),
    "346M": (1.5e-3, 256, 16e9),
    "90M-code": (2e-3, 128, 3.4e9),
}
_PAPER_SIZES = {  # d, heads, enc/main/dec layers
    "18M": (384, 6, 2, 6, 2),
    "32M": (512, 8, 2, 6, 2),
    "40M": (512, 8, 4, 6, 4),
    "73M": (768, 12, 2, 6, 2),
    "130M": (768, 12, 2, 12, 2),
    "147M": (768, 12, 4, 12, 4),
    "346M": (1024, 16, 2, 20, 2),
    "90M-code": (768, 12, 4, 6, 4),
}


def _paper_preset(name: str) -> dict[str, Any]:
    d, h, e, m, u = _PAPER_SIZES[name]
    lr, batch, total = _PAPER_OPT[name]
    warmup = 2.5e8 if name == "90M-code" else total * 0.075  # 147M: 4.5e8 of 6e9
    return {
        "model.d_model": d, "model.n_heads": h, "model.enc_layers": e, "model.main_layers": m,
        "model.dec_layers": u, "model.seq_len": 4096, "model.window": 64, "model.head_norm": False,
        "model.chunk_pad_multiple": 64,
        "train.lr": lr, "train.batch_size": batch, "train.micro_batch": 8,
        "train.total_bytes": int(total), "train.warmup_bytes": int(warmup),
        "train.log_every": 10, "train.eval_every_bytes": int(100 * batch * 4096), "train.eval_docs": 256,
        "data.packing": "document", "data.min_doc_bytes": 4096, "data.max_doc_bytes": 1 << 30,
        "data.val_docs": 256,
    }


PRESETS: dict[str, dict[str, Any]] = {
    # seconds on a CPU: for tests and the CLI contract
    "smoke": {
        "model.d_model": 32, "model.n_heads": 2, "model.enc_layers": 1, "model.main_layers": 1,
        "model.dec_layers": 1, "model.seq_len": 64, "model.window": 16,
        "train.batch_size": 4, "train.lr": 3e-3, "train.total_bytes": 4 * 64 * 12,
        "train.warmup_bytes": 4 * 64 * 2, "train.log_every": 2, "train.eval_every_bytes": 0,
        "train.eval_docs": 8, "train.dtype": "fp32",
    },
    # a 10-30 minute CPU experiment that learns whitespace boundaries (fast-learning policy settings)
    "tiny": {
        "model.d_model": 192, "model.n_heads": 3, "model.enc_layers": 2, "model.main_layers": 3,
        "model.dec_layers": 2, "model.seq_len": 512, "model.window": 64,
        "train.batch_size": 16, "train.lr": 2e-3, "train.total_bytes": 6_000_000,
        "train.warmup_bytes": 500_000, "train.log_every": 10, "train.eval_every_bytes": 1_000_000,
        "train.eval_docs": 64,
        # technical docs plus some literature (README's first command; fetched once from the package registries)
        "data.source": "english",
    },
    **{name: _paper_preset(name) for name in _PAPER_SIZES},
}

# Recipes: named bundles of settings applied after the preset. A recipe may also name the
# "preset" and "method" it is meant for; they apply unless the caller names others.
_PAPER_RUN = {
    # the paper's estimator (spec 3) and its hardware-independent batch: 128 x 4096 bytes per
    # step, the baseline over each 8-sequence micro-batch as on the reference's 4 GPUs
    "boundary.window": 8, "boundary.scale": 0.0625, "boundary.gamma": 0.99,
    "boundary.reward": "early_exit", "boundary.baseline": "batch_mean", "boundary.baseline_group": 8,
    "boundary.pg_weight": 0.01, "boundary.rate_weight": 0.01, "boundary.lm_weight": 0.9,
    "boundary.early_weight": 0.1, "boundary.target_rate": 0.2,
    "train.batch_bytes": 128 * 4096, "train.seed": 42, "train.dtype": "auto",  # bf16 on GPUs
}
_ABLATION = {"preset": "18M", "method": "rl", **_PAPER_RUN, "train.batch_bytes": 32 * 4096,
             "data.source": "data/fineweb"}

RECIPES: dict[str, dict[str, Any]] = {
    # the paper's policy and estimator settings (spec sections 2-3) on any preset
    "paper-policy": {"boundary.window": 8, "boundary.scale": 0.0625, "boundary.gamma": 0.99},
    # the fast-learning policy that the tiny preset uses by default
    "fast-policy": {"boundary.window": 1, "boundary.scale": 1.0},
    # the paper's runs, one command each after `rltok data prepare` (docs/recipes.md)
    "paper-147m-fineweb": {"preset": "147M", "method": "rl", **_PAPER_RUN, "data.source": "data/fineweb"},
    "paper-90m-codeparrot": {"preset": "90M-code", "method": "rl", **_PAPER_RUN, "data.source": "data/codeparrot"},
    # the ablation table (spec 7.3; its model size is not stated: the 18M preset by default)
    "ablation-baseline": dict(_ABLATION),
    "ablation-gamma1": {**_ABLATION, "boundary.gamma": 1.0},
    "ablation-no-early-exit": {**_ABLATION, "boundary.reward": "neg_ce"},
    "ablation-no-batch-relative": {**_ABLATION, "boundary.baseline": "none"},
    "ablation-w1": {**_ABLATION, "boundary.window": 1},
    "ablation-no-rate-penalty": {**_ABLATION, "boundary.rate_weight": 0.0},
}
RECIPE_TARGETS = ("preset", "method")  # recipe keys that are not config fields


# GPU kinds for `rltok plan`: (memory bytes, dense bf16 FLOP/s from the data sheets, as
# rltok.bench.DATASHEET_PEAKS)
GPUS: dict[str, tuple[float, float]] = {
    "h100": (80 * 2**30, 989.4e12),
    "h200": (141e9, 989.4e12),
    "a100": (80 * 2**30, 312e12),
    "b200": (180e9, 2250e12),
}
