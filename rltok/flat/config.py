"""The flat baselines' own options: the ``flat.*`` section of a run's config.

A flat baseline has no boundaries; its ``boundary`` section is the base BoundaryConfig of the
U-Net it is matched to (``boundary.target_rate``: the rate at which that U-Net's FLOPs, and the
token LM's BPE, are fitted). Its shape is here, not under ``boundary.*``: depth and MLP width (0 =
chosen at setup to match the U-Net, and then written into the run's config) and, per model, the
attention window or the tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..bpe import TokenizerOptions
from ..errors import RltokError


@dataclass
class FlatConfig:
    n_layers: int = 0  # 0: chosen at setup to match the reference U-Net
    mlp_hidden: int = 0  # 0: chosen (with n_layers) to match it exactly

    def validate(self) -> None:
        for k in ("n_layers", "mlp_hidden"):
            if getattr(self, k) < 0:
                raise RltokError(f"flat.{k}={getattr(self, k)} must be >= 0")


@dataclass
class BytesLMConfig(FlatConfig):
    # flops: the reference U-Net's training FLOPs per byte (at boundary.target_rate); params: its
    # parameter count
    match: str = "flops"
    window: int = 0  # attention window in bytes; 0 = full causal attention

    def validate(self) -> None:
        super().validate()
        if self.match not in ("flops", "params"):
            raise RltokError(f"flat.match={self.match!r} must be flops or params")
        if self.window < 0:
            raise RltokError(f"flat.window={self.window} must be >= 0")


@dataclass
class TokenLMConfig(TokenizerOptions, FlatConfig):
    """The tokenizer's options (``TokenizerOptions``) under ``flat.*``, and its measured rate."""

    token_rate: float = 0.0  # tokens per byte of the tokenizer (measured at setup); 0: target_rate
    # flops: the reference U-Net's training FLOPs per byte; body_flops: the same with each model's
    # output head left out (a production vocabulary's head alone can cost more than the whole
    # small U-Net: GPT-NeoX's 50k-token head is 1.3x the `tiny` U-Net's FLOPs at 0.215 tokens/byte)
    match: str = "flops"

    def validate(self) -> None:
        super().validate()
        self.check_tokenizer_options("flat")
        if self.match not in ("flops", "body_flops"):
            raise RltokError(f"flat.match={self.match!r} must be flops or body_flops")
        if self.token_rate < 0:
            raise RltokError(f"flat.token_rate={self.token_rate} must be >= 0")


# keys a flat baseline kept under boundary.* up to format 7, and their names here
FORMER_BOUNDARY_KEYS = {"n_layers": "n_layers", "mlp_hidden": "mlp_hidden", "attn_window": "window",
                        "match": "match", "tokenizer": "tokenizer", "vocab_size": "vocab_size",
                        "fit_bytes": "fit_bytes", "token_rate": "token_rate"}
