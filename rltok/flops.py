"""Model FLOPs of the byte-level U-Net, counted analytically (for throughput, MFU, FLOP matching).

Counts the useful multiply-adds of the model (2 FLOPs each), per input byte, with chunks at a
given rate r (chunks per byte; the achieved rate, not the padded chunk tensor):

* matmuls: every byte goes through the encoder and decoder blocks, both heads (final and
  early-exit, 257 outputs each) and the boundary module's own weights; every chunk goes through
  the main-network blocks. A block holds q/k/v/out (4 d^2) and the gated MLP (3 d h).
* attention scores and values: 4 d per (query, key) pair actually attended: the byte layers
  attend min(t + 1, window) keys, the main network (M = r S chunks) attends causally, (M + 1) / 2
  keys on average. Causal masking is counted as saved work (not the PaLM "full T" convention),
  so MFU is not flattered.
* training = 3 x forward (the backward pass costs two forward passes).

Embedding lookups, norms, RoPE, softmax and the estimator's own arithmetic are not counted (they
are not matmuls; the usual MFU convention).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .config import N_OUTPUT_IDS, ModelConfig


@dataclass
class FlopCount:
    """Forward FLOPs per input byte, by part."""

    byte_matmul: float  # encoder + decoder blocks, heads, boundary module
    chunk_matmul: float  # main network (already multiplied by the rate)
    byte_attention: float
    chunk_attention: float

    @property
    def forward(self) -> float:
        return self.byte_matmul + self.chunk_matmul + self.byte_attention + self.chunk_attention

    @property
    def matmul(self) -> float:
        return self.byte_matmul + self.chunk_matmul

    @property
    def train(self) -> float:
        return 3.0 * self.forward

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "forward": self.forward, "train": self.train}


def block_params(d: int, hidden: int) -> int:
    """Matmul weights of one Transformer block: q, k, v, out projections and the gated MLP."""
    return 4 * d * d + 3 * d * hidden


def mean_window_keys(seq_len: int, window: int) -> float:
    """Mean number of keys per query under causal sliding-window attention: sum_t min(t+1, W) / S."""
    W = min(window, seq_len)
    total = W * (W + 1) // 2 + (seq_len - W) * W
    return total / seq_len


def unet_flops(cfg: ModelConfig, rate: float, boundary_params: int = 0) -> FlopCount:
    """Forward FLOPs per byte of a ByteUNet with ``cfg`` at ``rate`` chunks per byte.

    ``boundary_params``: matmul weights the boundary module applies at every byte (the ``rl``
    policy: d x w)."""
    d, S = cfg.d_model, cfg.seq_len
    hb = max(1, int(round(d * cfg.byte_mlp_ratio)))
    hm = max(1, int(round(d * cfg.main_mlp_ratio)))
    n_byte = cfg.enc_layers + cfg.dec_layers
    per_byte_params = n_byte * block_params(d, hb) + 2 * d * N_OUTPUT_IDS + boundary_params
    M = max(1.0, rate * S)
    return FlopCount(
        byte_matmul=2.0 * per_byte_params,
        chunk_matmul=2.0 * rate * cfg.main_layers * block_params(d, hm),
        byte_attention=n_byte * 4.0 * d * mean_window_keys(S, cfg.window),
        chunk_attention=rate * cfg.main_layers * 4.0 * d * (M + 1) / 2,
    )


def train_flops_per_byte(cfg: ModelConfig, rate: float, boundary_params: int = 0) -> float:
    """Training FLOPs per byte (forward + backward) at ``rate`` chunks per byte."""
    return unet_flops(cfg, rate, boundary_params).train


def boundary_matmul_params(model) -> int:
    """Matmul weights (2-D parameters) of a model's boundary module; 0 if it has none."""
    mod = getattr(model, "boundary", None)
    if mod is None:
        return 0
    return sum(p.numel() for p in mod.parameters() if p.dim() >= 2)
