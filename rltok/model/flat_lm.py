"""Flat (non-hierarchical) Transformer language models for the baselines ``bytes`` and ``bpe-lm``.

Same blocks as the U-Net (``layers.Block``: pre-norm, RoPE, GeGLU), full causal attention (or a
sliding window) over one sequence of ids, one output head. Pure ``nn.Module``s: the conversion of
byte batches to token batches, the losses and the FLOP counts live in the method modules
(``bytes_lm``, ``token_lm``), registered for these classes.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .hub_mixin import HubMixin
from .layers import Block, KVCache, RMSNorm, rope_angles


class FlatLM(nn.Module, HubMixin):
    def __init__(self, n_inputs: int, n_outputs: int, d_model: int, n_heads: int, n_layers: int,
                 mlp_hidden: int, window: int | None = None, rope_theta: float = 10000.0,
                 norm_eps: float = 1e-6):
        super().__init__()
        self.d_model, self.n_heads, self.window, self.rope_theta = d_model, n_heads, window, rope_theta
        self.embed = nn.Embedding(n_inputs, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, mlp_hidden, window, norm_eps) for _ in range(n_layers))
        self.norm = RMSNorm(d_model, norm_eps)
        self.head = nn.Linear(d_model, n_outputs)

    def forward(self, ids: Tensor) -> Tensor:
        """(B, T) ids -> (B, T, n_outputs) logits for the next id."""
        T = ids.shape[1]
        cos, sin = rope_angles(torch.arange(T, device=ids.device), self.d_model // self.n_heads, self.rope_theta)
        x = self.embed(ids)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        return self.head(self.norm(x))

    # -- incremental decoding, beside forward (BLT's entropy model decodes byte by byte). Not
    # named prefill/step: rltok.generate takes a model with a ``step`` for a decodable U-Net
    def allocate_inference_cache(self, batch: int, device=None) -> list[KVCache]:
        """Empty key/value caches, one per layer (ring caches of ``window`` slots, or growing)."""
        dtype = self.head.weight.dtype
        return [KVCache.empty(batch, self.n_heads, self.d_model // self.n_heads, self.window, device=device,
                              dtype=dtype) for _ in self.blocks]

    def decode_prefill(self, ids: Tensor, lengths: Tensor) -> tuple[Tensor, list[KVCache]]:
        """:meth:`forward` over (B, T) ids, and the caches after the first ``lengths[b]`` ids of
        each row."""
        B, T = ids.shape
        positions = torch.arange(T, device=ids.device)
        cos, sin = rope_angles(positions, self.d_model // self.n_heads, self.rope_theta)
        x = self.embed(ids)
        caches = []
        for blk in self.blocks:
            kv = []
            x = blk(x, cos, sin, on_kv=lambda k, v: kv.append((k, v)))
            caches.append(KVCache.from_prefill(*kv[0], positions[None].expand(B, T), lengths, self.window))
        return self.head(self.norm(x)), caches

    def decode_step(self, ids: Tensor, pos: Tensor, caches: list[KVCache]) -> Tensor:
        """One new id per row, ``ids`` (n,) at positions ``pos`` (n,): (n, n_outputs) logits for
        the next id; the caches advance in place."""
        cos, sin = rope_angles(pos[:, None], self.d_model // self.n_heads, self.rope_theta)
        x = self.embed(ids)[:, None]
        for blk, c in zip(self.blocks, caches):
            x = blk.step(x, cos, sin, c, pos)
        return self.head(self.norm(x))[:, 0]

    def param_groups_for_flops(self) -> tuple[int, int]:
        """(matmul parameters applied per byte, per token/chunk); subclasses say which."""
        n = sum(p.numel() for m in (*self.blocks, self.head) for _, p in m.named_parameters() if p.dim() >= 2)
        return n, 0


class ByteLM(FlatLM):
    """The ``bytes`` baseline: a FlatLM over byte ids."""


class TokenLM(FlatLM):
    """Flat LM over token ids 0..V-1 plus BOS = V (input and output) and PAD = V+1 (input)."""

    def __init__(self, vocab: int, d_model: int, n_heads: int, n_layers: int, mlp_hidden: int,
                 token_rate: float, tokenizer=None, rope_theta: float = 10000.0, norm_eps: float = 1e-6):
        super().__init__(vocab + 2, vocab + 1, d_model, n_heads, n_layers, mlp_hidden, None, rope_theta, norm_eps)
        self.vocab = vocab
        self.bos_id, self.pad_id = vocab, vocab + 1
        self.token_rate = token_rate
        self.tokenizer = tokenizer

    def param_groups_for_flops(self) -> tuple[int, int]:
        n, _ = super().param_groups_for_flops()
        return 0, n  # every matmul runs once per token


def flat_params(n_inputs: int, n_outputs: int, d: int, n_layers: int, mlp_hidden: int) -> int:
    """Exact parameter count of a FlatLM (tested against the module)."""
    block = 4 * d * d + 3 * d * mlp_hidden + 2 * d  # qkv + out, gate_up + down, two norms
    return n_inputs * d + n_layers * block + d + n_outputs * d + n_outputs
