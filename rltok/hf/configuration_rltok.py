"""The transformers configuration of an rltok model: the run config, carried whole.

``run_config`` is the rltok run config (``RunConfig.to_dict()`` with ``rltok_version`` and
``format_version``), from which the modeling code builds the U-Net exactly as rltok does;
``method_files`` holds the files the boundary method reads while it is built (a BPE method's
``tokenizer.json``), by name. The usual transformers attributes (``vocab_size``, ``hidden_size``,
``max_position_embeddings``, the special token ids) are derived from it for tools that read them:

* ids: bytes 0..255, 256 = BOS (also end of document when predicted, so ``eos_token_id`` is 256
  too), 257 = PAD (input only); ``vocab_size`` 258, and the logits have 258 columns, PAD's
  always the dtype's minimum;
* ``max_position_embeddings`` = seq_len - 1: the forward appends one padding column after the
  ids (it carries the boundary the U-Net forces at a sequence's end, so that every real position
  is decided by the method), so seq_len - 1 ids fill the trained context; it is also the window
  lm-eval's ``hf`` backend then uses, the same as rltok's scorer (which feeds one byte more and
  ignores its prediction);
* ``boundary_mode``: ``greedy`` (a boundary where its probability > 0.5: deterministic, the
  default of ``forward`` and ``generate``) or ``sample`` (as in training; ``forward`` then draws
  its uniforms from ``noise=`` or torch's generator, ``generate`` from its ``seed``).

This file is copied into every export (``rltok.hf.save_for_transformers``), with the rltok code
it imports.
"""

from __future__ import annotations

from transformers import PretrainedConfig

from ..schema import BOS, N_INPUT_IDS, PAD

_DERIVED = ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "max_position_embeddings")


class RltokConfig(PretrainedConfig):
    model_type = "rltok"

    def __init__(self, run_config: dict | None = None, method_files: dict | None = None,
                 boundary_mode: str = "greedy", rltok_export: str = "rltok-transformers-v1", **kwargs):
        if boundary_mode not in ("greedy", "sample"):
            raise ValueError(f"boundary_mode={boundary_mode!r} must be greedy or sample")
        self.run_config = dict(run_config or {})
        self.method_files = dict(method_files or {})
        self.boundary_mode = boundary_mode
        self.rltok_export = rltok_export  # the layout of the export (rltok.hf.format)
        shape = self.run_config.get("model") or {}
        seq_len = shape.get("seq_len")
        for k in _DERIVED:
            kwargs.pop(k, None)  # always derived from the run config
        self.vocab_size = N_INPUT_IDS
        self.hidden_size = shape.get("d_model")
        self.num_attention_heads = shape.get("n_heads")
        self.num_hidden_layers = sum(int(shape.get(k) or 0) for k in ("enc_layers", "main_layers", "dec_layers"))
        self.max_position_embeddings = seq_len - 1 if isinstance(seq_len, int) else None
        kwargs.setdefault("bos_token_id", BOS)
        kwargs.setdefault("eos_token_id", BOS)
        kwargs.setdefault("pad_token_id", PAD)
        kwargs.setdefault("tie_word_embeddings", False)
        kwargs.setdefault("use_cache", False)
        super().__init__(**kwargs)

    @property
    def method(self) -> str | None:
        return self.run_config.get("method")
