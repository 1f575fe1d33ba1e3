"""Flat baselines: Transformers with no hierarchy, in the same harness as the U-Net methods.

* ``bytes`` (``bytes_lm``): a byte-level Transformer at the U-Net's training FLOPs per byte (or
  its parameters, ``flat.match=params``);
* ``bpe-lm`` (``token_lm``): a Transformer over BPE tokens at the U-Net's training FLOPs per
  byte, scored in bits per byte.

They are not boundary methods: their models (``model``) are plain FlatLMs, their options are the
``flat.*`` section (``config``), and their losses, scores and FLOP counts are registered for their
model classes (``rltok.objectives.training_loss``/``score``, ``rltok.flops.training_flops_per_byte``
dispatch on the model's class). Each module registers its method's name on import.
"""

from __future__ import annotations

from .config import BytesLMConfig, FlatConfig, TokenLMConfig
from ..model.flat_lm import ByteLM, FlatLM, TokenLM

__all__ = ["BytesLMConfig", "FlatConfig", "TokenLMConfig", "ByteLM", "FlatLM", "TokenLM"]
