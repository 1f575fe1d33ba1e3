"""An rltok U-Net as a transformers causal LM: ``RltokForCausalLM`` (``PreTrainedModel`` +
``GenerationMixin``) around the U-Net itself, which it holds as ``model`` (the same module and
weights; tensor names ``model.*``).

``forward(input_ids, attention_mask=None, labels=None)`` returns next-byte logits for every input
position, as rltok computes them: each row's ids (those the attention mask keeps, PAD ids
dropped, packed to the left) get one padding column appended, which carries the boundary the
U-Net forces at a sequence's end, so that every real position is decided by the boundary method
(as in rltok's prefill and scorer), and the logits go back to the positions the ids came from
(padding positions get zeros). The logits have 258 columns: bytes, BOS (end of document) and PAD,
whose logit is the dtype's minimum (PAD is never predicted). Boundaries are greedy by default
(``config.boundary_mode``; deterministic); ``boundary_mode="sample"`` draws them from ``noise``
(B, T uniforms) or torch's generator; ``boundaries`` (B, T) imposes them. The output also has
``boundaries``: the bytes that end a chunk. ``labels`` give the usual shifted cross-entropy (the
boundary decisions get no gradient through it).

``generate`` is rltok's cached decoding (``rltok.generate.generate``), not transformers' loop:
the same bytes as ``rltok generate --dtype fp32`` for the same seed and settings
(``do_sample=False``: greedy bytes, temperature 0; ``temperature``/``top_p``/``top_k``;
``boundary_mode``: greedy by default here, as ``--greedy-boundaries``, while ``rltok generate``
samples them unless told, so pass ``boundary_mode="sample"`` for its default; ``seed``, by
default drawn from torch's generator so that ``torch.manual_seed`` reproduces it;
``stop_strings``; ``compute_dtype`` for rltok's autocast, ``fp32`` by default).
It returns transformers' convention: each row's input ids followed by the new ids (BOS when the
model ended the document), right-padded with PAD.

This file is copied into every export (``rltok.hf.save_for_transformers``), with the rltok code
it imports.
"""

from __future__ import annotations

import copy
import importlib
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.generation.utils import GenerateDecoderOnlyOutput
from transformers.modeling_outputs import CausalLMOutput

from .configuration_rltok import RltokConfig
from .format import build_model, method_files_of, run_config_of
from ..generate import generate as rltok_generate
from ..model.inference import _fit, _with_end_column
from ..schema import BOS, N_INPUT_IDS, N_OUTPUT_IDS, PAD

# generation settings rltok's decoding does not implement, with the value that means "off"
_OFF = {"num_beams": 1, "num_beam_groups": 1, "penalty_alpha": None, "repetition_penalty": 1.0,
        "no_repeat_ngram_size": 0, "min_length": 0, "min_new_tokens": 0, "min_p": None, "typical_p": 1.0,
        "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "diversity_penalty": 0.0, "encoder_repetition_penalty": 1.0,
        "length_penalty": 1.0, "bad_words_ids": None, "force_words_ids": None, "suppress_tokens": None,
        "begin_suppress_tokens": None, "sequence_bias": None, "guidance_scale": None, "watermarking_config": None,
        "forced_bos_token_id": None, "forced_eos_token_id": None, "constraints": None,
        "prompt_lookup_num_tokens": None}
# keyword arguments transformers' callers pass that change nothing here
_IGNORED = {"use_cache", "synced_gpus", "tokenizer", "assistant_model", "negative_prompt_ids",
            "negative_prompt_attention_mask", "use_model_defaults", "custom_generate", "position_ids",
            "prefix_allowed_tokens_fn", "cache_implementation", "output_attentions", "output_hidden_states"}


@dataclass
class RltokCausalLMOutput(CausalLMOutput):
    """``CausalLMOutput`` plus ``boundaries`` (B, T) bool: the bytes that end a chunk."""

    boundaries: torch.Tensor | None = None


class RltokPreTrainedModel(PreTrainedModel):
    config_class = RltokConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = False
    _no_split_modules = ["ByteUNet"]  # one device: the U-Net's parts talk to each other

    def _init_weights(self, module: nn.Module) -> None:
        # rltok's modules initialise themselves when built, and from_pretrained loads every saved
        # tensor; what it cannot load are the non-persistent buffers (a controller's rate offset),
        # which rltok builds as zeros
        for name in getattr(module, "_non_persistent_buffers_set", ()):
            buf = module._buffers.get(name)
            if buf is not None:
                with torch.no_grad():
                    buf.zero_()


class RltokForCausalLM(RltokPreTrainedModel, GenerationMixin):
    def __init__(self, config: RltokConfig, model: nn.Module | None = None):
        """``model``: an rltok U-Net to wrap as it is (``rltok.hf.to_transformers``); else one is
        built from ``config.run_config`` (and loaded by ``from_pretrained``)."""
        super().__init__(config)
        cfg = run_config_of(config.run_config, "config.run_config")
        if model is None:
            model = build_model(cfg, method_files_of({"method_files": config.method_files}, "config.method_files"))
        if not callable(getattr(model, "prefill", None)):
            raise ValueError(f"{type(model).__name__}: the transformers wrapper covers rltok's byte-level U-Nets")
        if getattr(model, "run_config", None) is None:
            model.run_config = cfg
        self.model = model
        self.post_init()

    def save_pretrained(self, save_directory, *args, **kwargs):
        """transformers' ``save_pretrained``; from rltok's own class (not an export's copy, which
        transformers copies itself) also the code files and ``auto_map``, so that what a
        ``Trainer`` or PEFT saves loads with ``trust_remote_code=True`` as an export does."""
        out = super().save_pretrained(save_directory, *args, **kwargs)
        if __name__.startswith("rltok.") and kwargs.get("is_main_process", True):
            importlib.import_module("rltok.hf.bundle").write_code(save_directory)  # not part of an export
        return out

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.embed = value

    def get_output_embeddings(self):
        return None  # the head predicts 257 ids (no PAD) and is not tied to the embedding

    # -- forward ------------------------------------------------------------------------------------
    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                labels: torch.LongTensor | None = None, *, noise: torch.Tensor | None = None,
                boundaries: torch.Tensor | None = None, boundary_mode: str | None = None,
                return_dict: bool | None = None, **kwargs):
        if input_ids is None:
            raise ValueError("RltokForCausalLM needs input_ids (byte ids; inputs_embeds are not supported)")
        if kwargs.get("inputs_embeds") is not None or kwargs.get("past_key_values") is not None:
            raise ValueError("RltokForCausalLM takes input_ids only (no inputs_embeds, no past_key_values: "
                             "generate() decodes with rltok's own caches)")
        mode = boundary_mode or self.config.boundary_mode
        if mode not in ("greedy", "sample"):
            raise ValueError(f"boundary_mode={mode!r} must be greedy or sample")
        ids = input_ids
        B, T = ids.shape
        keep = ids != PAD
        if attention_mask is not None:
            keep &= attention_mask.to(torch.bool)
        lengths = keep.sum(1)
        if bool(keep.all()):
            order = None
            S = T + 1
            packed = F.pad(ids, (0, 1), value=PAD)
        else:  # each row's kept ids packed to the left, in order, then PAD
            order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)
            S = int(lengths.max()) + 1
            packed = ids.gather(1, order)[:, : S - 1]
            packed = F.pad(packed, (0, 1), value=PAD)
            packed = packed.masked_fill(torch.arange(S, device=ids.device)[None] >= lengths[:, None], PAD)

        def pack(x: torch.Tensor | None) -> torch.Tensor | None:  # (B, T) per position -> (B, S)
            if x is None:
                return None
            x = _fit(x.to(ids.device), T)
            return _fit(x if order is None else x.gather(1, order), S)

        u = pack(noise)
        if u is None and mode == "sample":
            u = torch.rand(B, S, device=ids.device)
        fixed = pack(boundaries)
        out = self.model(packed, noise=u, boundaries=None if fixed is None else fixed.to(torch.bool), mode=mode,
                         valid=_with_end_column(lengths, S))
        logits = out.logits[:, : S - 1]
        b = out.boundary.b[:, : S - 1].to(torch.bool)
        if order is not None:  # back to the positions the ids came from
            real = (torch.arange(S - 1, device=ids.device)[None] < lengths[:, None])
            idx = order[:, : S - 1]
            logits = torch.zeros(B, T, N_OUTPUT_IDS, dtype=logits.dtype, device=logits.device).scatter(
                1, idx[..., None].expand(-1, -1, N_OUTPUT_IDS), logits * real[..., None])
            b = torch.zeros(B, T, dtype=torch.bool, device=ids.device).scatter(1, idx, b & real)
        pad_col = torch.full((B, T, N_INPUT_IDS - N_OUTPUT_IDS), torch.finfo(logits.dtype).min,
                             dtype=logits.dtype, device=logits.device)
        logits = torch.cat([logits, pad_col], dim=-1)
        loss = None
        if labels is not None:
            target = labels[:, 1:].masked_fill(labels[:, 1:] == PAD, -100)
            loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, N_INPUT_IDS), target.reshape(-1),
                                   ignore_index=-100)
        if return_dict is False:
            return (logits,) if loss is None else (loss, logits)
        return RltokCausalLMOutput(loss=loss, logits=logits, boundaries=b)

    # -- generate: rltok's cached decoding ----------------------------------------------------------
    @torch.no_grad()
    def generate(self, inputs: torch.Tensor | None = None, generation_config=None, logits_processor=None,
                 stopping_criteria=None, streamer=None, *, input_ids: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None, seed: int | None = None,
                 boundary_mode: str | None = None, compute_dtype: str = "fp32", **kwargs) -> torch.LongTensor:
        """Continue each row of ``input_ids`` with rltok's cached decoding (module docstring).
        Settings come from ``generation_config`` (the model's by default) updated with
        ``kwargs``; ones rltok does not implement (beams, repetition penalties, logits
        processors, streamers) raise instead of being ignored."""
        ids = input_ids if input_ids is not None else inputs
        device = next(self.parameters()).device
        if ids is None:
            ids = torch.full((1, 1), BOS, dtype=torch.long, device=device)
        if ids.dim() == 1:
            ids = ids[None]
        gc = copy.deepcopy(generation_config if generation_config is not None else self.generation_config)
        rest = gc.update(**kwargs)
        unknown = sorted(k for k, v in rest.items() if k not in _IGNORED and v is not None)
        if unknown:
            raise TypeError(f"RltokForCausalLM.generate: unsupported arguments {', '.join(unknown)}")
        if logits_processor:
            raise NotImplementedError("rltok's decoding applies no transformers logits processors")
        if streamer is not None:
            raise NotImplementedError("rltok's decoding does not stream to a transformers streamer "
                                      "(rltok.generate.generate(..., stream=...) does)")
        if stopping_criteria:
            warnings.warn("stopping_criteria are not applied by rltok's decoding (it stops at max_new_tokens, "
                          "end of document and stop_strings)", stacklevel=2)
        for k, off in _OFF.items():
            v = getattr(gc, k, None)
            if v is not None and v != off and not (off is None and v in (0, 0.0, 1, 1.0, [], {})):
                raise NotImplementedError(f"generation setting {k}={v!r} is not implemented by rltok's decoding")
        eos = gc.eos_token_id
        if eos is not None and set([eos] if isinstance(eos, int) else list(eos)) != {BOS}:
            raise NotImplementedError(f"eos_token_id={eos!r}: rltok ends a document at BOS ({BOS}) only")
        if gc.max_new_tokens is not None:
            max_new = int(gc.max_new_tokens)
        elif gc.max_length is not None:
            max_new = max(0, int(gc.max_length) - ids.shape[1])
        else:
            max_new = 256
        sample = bool(gc.do_sample)
        temperature = float(gc.temperature if gc.temperature is not None else 1.0) if sample else 0.0
        top_p = float(gc.top_p if gc.top_p is not None else 1.0) if sample else 1.0
        top_k = int(gc.top_k or 0) if sample else 0
        stops = gc.stop_strings
        stops = [stops] if isinstance(stops, str) else (list(stops) if stops else None)
        n = int(gc.num_return_sequences or 1)
        keep = ids != PAD
        if attention_mask is not None:
            keep &= attention_mask.to(torch.bool)
        prompts = []
        for r in range(ids.shape[0]):
            row = ids[r][keep[r]].tolist()
            if row and row[0] == BOS:
                row = row[1:]  # rltok puts BOS in front itself
            if any(not 0 <= x < 256 for x in row):
                raise ValueError(f"row {r}: a prompt is bytes (0..255) after an optional leading BOS")
            prompts += [bytes(row)] * n
        rows = ids.repeat_interleave(n, dim=0)
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item())  # torch.manual_seed reproduces a call
        res = rltok_generate(self.model, prompts, max_new, temperature=temperature, top_p=top_p, top_k=top_k,
                             boundary_mode=boundary_mode or self.config.boundary_mode, stop=stops, seed=seed,
                             dtype=compute_dtype)
        pad = gc.pad_token_id if gc.pad_token_id is not None else PAD
        new = [g.sampled for g in res]
        width = rows.shape[1] + max((len(s) for s in new), default=0)
        out = torch.full((rows.shape[0], width), pad, dtype=torch.long, device=rows.device)
        out[:, : rows.shape[1]] = rows
        for r, s in enumerate(new):
            if s:
                out[r, rows.shape[1]: rows.shape[1] + len(s)] = torch.tensor(s, dtype=torch.long)
        if gc.return_dict_in_generate:
            return GenerateDecoderOnlyOutput(sequences=out)
        return out
