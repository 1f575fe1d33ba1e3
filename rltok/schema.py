"""Typed configuration: the dataclasses a run is described by, the token ids, and reading
``key=value`` overrides into them.

A run is described by one :class:`RunConfig`: the ``method`` and its own config dataclass
(``boundary``), the U-Net shape (``model``), optimisation (``train``) and data (``data``); a flat
baseline (``rltok/flat/``) adds its own shape and tokenizer options (``flat``).
Keys are dotted (``boundary.gamma``) or bare when the bare name is unique (``gamma``).

This module knows no method and no preset, so that every part of rltok can import it: resolving a
run's configuration from a method, a preset, a recipe and overrides is ``rltok.config``'s (which
knows the methods through ``rltok.methods``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from dataclasses import dataclass, field, fields
from typing import Any

from .errors import RltokError

# Token ids: bytes are 0..255; BOS also serves as end-of-document when predicted; PAD is input-only.
BOS = 256
PAD = 257
N_INPUT_IDS = 258
N_OUTPUT_IDS = 257  # 256 bytes + end of document (BOS)


@dataclass
class ModelConfig:
    """Shape of the byte-level U-Net (also used by the flat baselines for d_model/heads/seq_len)."""

    d_model: int = 192
    n_heads: int = 3
    enc_layers: int = 2
    main_layers: int = 3
    dec_layers: int = 2
    byte_mlp_ratio: float = 1.0  # paper: byte-level MLP width = d
    main_mlp_ratio: float = 4.0  # paper: main-network MLP width = 4d
    window: int = 64  # sliding-window size of the byte-level layers, in bytes (keys incl. itself)
    seq_len: int = 512  # bytes per training sequence (the model's context)
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    head_norm: bool = True  # RMSNorm before both output heads (the paper applies none)
    # pad the chunk count to a multiple: fewer distinct shapes for the main network's attention
    # (the CPU's per-shape kernel cache, torch.compile); the padding chunks cost attention only
    chunk_pad_multiple: int = 8
    # static chunk shapes in training (rltok/model/static.py): "auto" on the accelerator path
    # (GPUs: no host sync to size the chunk tensors), "on" everywhere, "off" never. The caps, as
    # multiples of the target rate: chunks per row, and chunks per micro-batch (packed rows);
    # they grow when a batch exceeds them (that step is repeated)
    static_chunks: str = "auto"
    chunk_cap_row: float = 1.5
    chunk_cap_total: float = 1.15
    # one output head for the early exit and the final prediction (the authors' option); the
    # paper deep-copies the head instead
    shared_head: bool = False
    # 1: bytes -> chunks -> main network (the paper). 2: the main network is itself a stage
    # over the chunks (rltok/model/stage.py): its own encoder, router, main network and decoder
    stages: int = 1
    # stages=2: layers over the outer chunks before the inner router and after the inner main
    # network. 0 and 0: the main network moves up a level, over the inner chunks, at the
    # one-stage model's parameters and (within ~1% on tiny) its training FLOPs per byte
    inner_enc_layers: int = 0
    inner_dec_layers: int = 0

    def validate(self) -> None:
        _check(self.d_model >= 1, "model.d_model must be >= 1")
        _check(self.n_heads >= 1 and self.d_model % self.n_heads == 0,
               f"model.n_heads={self.n_heads} must divide model.d_model={self.d_model}")
        _check((self.d_model // self.n_heads) % 2 == 0, "model.d_model/n_heads must be even (RoPE)")
        for name in ("enc_layers", "main_layers", "dec_layers"):
            _check(getattr(self, name) >= 0, f"model.{name} must be >= 0")
        _check(self.window >= 1, f"model.window={self.window} must be >= 1")
        _check(self.seq_len >= 2, f"model.seq_len={self.seq_len} must be >= 2")
        _check(self.byte_mlp_ratio > 0 and self.main_mlp_ratio > 0, "model.*_mlp_ratio must be > 0")
        _check(self.rope_theta > 0, f"model.rope_theta={self.rope_theta} must be > 0")
        _check(self.norm_eps >= 0, f"model.norm_eps={self.norm_eps} must be >= 0")
        _check(self.chunk_pad_multiple >= 1, "model.chunk_pad_multiple must be >= 1")
        _check(self.static_chunks in ("auto", "on", "off"),
               f"model.static_chunks={self.static_chunks!r} must be auto, on or off")
        _check(self.chunk_cap_row > 0 and self.chunk_cap_total > 0, "model.chunk_cap_* must be > 0")
        _check(self.stages >= 1, f"model.stages={self.stages} must be >= 1")
        _check(self.inner_enc_layers >= 0 and self.inner_dec_layers >= 0,
               "model.inner_enc_layers and model.inner_dec_layers must be >= 0")


@dataclass
class BoundaryConfig:
    """Settings every boundary method has. Methods subclass this with their own fields."""

    target_rate: float = 0.2  # r*: boundaries per byte (about 5 bytes per chunk)
    lm_weight: float = 1.0  # weight of the final head's cross-entropy
    early_weight: float = 0.0  # weight of the early-exit head's cross-entropy

    def validate(self) -> None:
        _check(0.0 < self.target_rate < 1.0,
               f"boundary.target_rate={self.target_rate} must be in (0, 1)")
        _check(self.lm_weight >= 0 and self.early_weight >= 0, "boundary.*_weight must be >= 0")


@dataclass
class ChunkerConfig:
    """The stage part that makes each chunk's vector from its bytes (model/dc.py): the
    ``chunker.*`` section of a boundary method's run."""

    # last: the chunk's last byte (SelectLast, the paper); mean: the mean of its bytes (MeanPool,
    # the authors' AverageTokenDownsampler); "": the method's own (each method names the pools
    # it supports: BoundaryModule.pools)
    pool: str = ""

    def validate(self) -> None:
        _check(self.pool in ("", "last", "mean"), f"chunker.pool={self.pool!r} must be last or mean")


@dataclass
class DechunkerConfig:
    """The stage part that hands each chunk's output back to its bytes (model/dc.py): the
    ``dechunker.*`` section of a boundary method's run."""

    # what a chunk adds to its bytes: add (zhat, the paper) or deviation (zhat - z: the main
    # network's change to the chunk vector, the authors' DistributeDeviationUpsampler)
    upsample: str = "add"
    scan_block: int = 64  # block length of the EMA dechunker's parallel scan (hnet's EMASmooth)

    def validate(self) -> None:
        _check(self.upsample in ("add", "deviation"),
               f"dechunker.upsample={self.upsample!r} must be add or deviation")
        _check(self.scan_block >= 1, f"dechunker.scan_block={self.scan_block} must be >= 1")


@dataclass
class TrainConfig:
    batch_size: int = 16  # sequences per optimizer step, summed over ranks and accumulation
    batch_bytes: int = 0  # > 0: the global batch in bytes (sets batch_size = batch_bytes / seq_len)
    micro_batch: int = 0  # sequences per forward on one rank; 0 = batch_size / world_size
    lr: float = 2e-3
    min_lr_ratio: float = 0.0  # cosine decays to lr * min_lr_ratio
    warmup_start_ratio: float = 0.1  # warmup starts at lr * this (paper: LinearLR from 0.1)
    warmup_bytes: int = 500_000
    total_bytes: int = 5_000_000
    max_steps: int = 0  # > 0 overrides total_bytes
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    grad_clip: float = 1.0
    dtype: str = "auto"  # bf16, fp32, or auto: bf16 on GPUs, the faster of the two on a CPU (precision.py)
    seed: int = 42
    log_every: int = 10  # optimizer steps between metric lines
    eval_every_bytes: int = 1_000_000  # validation bpb during training; 0 = only at the end
    eval_docs: int = 32  # validation documents scored during training
    ckpt_every: int = 0  # optimizer steps between checkpoints; 0 = every 10% of the run
    keep_checkpoints: int = 3
    max_bad_steps: int = 10  # consecutive non-finite steps before the run stops
    compile: bool = False
    # the whole training loss (router, chunking, networks, losses) as one torch.compile graph
    # (fullgraph): needs the static chunk shapes of the accelerator path (model.static_chunks)
    fullgraph: bool = False
    log_to: str = ""  # also log metrics to: "tensorboard", "wandb" or both, comma-separated
    wandb_project: str = "rltok"  # with log_to=wandb (offline with WANDB_MODE=offline)
    parallel: str = "ddp"  # ddp or fsdp (multi-process only)
    device: str = "auto"  # auto, cpu, cuda

    def validate(self) -> None:
        _check(self.batch_size >= 1, f"train.batch_size={self.batch_size} must be >= 1")
        _check(self.batch_bytes >= 0, f"train.batch_bytes={self.batch_bytes} must be >= 0")
        _check(self.micro_batch >= 0, "train.micro_batch must be >= 0")
        _check(self.lr > 0, f"train.lr={self.lr} must be > 0")
        _check(0 <= self.min_lr_ratio <= 1, "train.min_lr_ratio must be in [0, 1]")
        _check(0 < self.warmup_start_ratio <= 1, "train.warmup_start_ratio must be in (0, 1]")
        _check(self.warmup_bytes >= 0, "train.warmup_bytes must be >= 0")
        _check(self.total_bytes >= 1 or self.max_steps >= 1,
               "train.total_bytes (--bytes) or train.max_steps (--steps) must be >= 1")
        _check(self.max_steps >= 0, "train.max_steps must be >= 0")
        _check(self.weight_decay >= 0, "train.weight_decay must be >= 0")
        _check(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "train.beta1/beta2 must be in [0, 1)")
        _check(self.eps >= 0, f"train.eps={self.eps} must be >= 0")
        _check(self.seed >= 0, f"train.seed={self.seed} must be >= 0")
        _check(self.grad_clip >= 0, "train.grad_clip must be >= 0 (0 disables)")
        _check(self.dtype in ("auto", "bf16", "fp32"), f"train.dtype={self.dtype!r} must be auto, bf16 or fp32")
        _check(self.log_every >= 1, "train.log_every must be >= 1")
        _check(self.eval_every_bytes >= 0 and self.eval_docs >= 0, "train.eval_* must be >= 0")
        _check(self.ckpt_every >= 0, "train.ckpt_every must be >= 0")
        _check(self.keep_checkpoints >= 1, "train.keep_checkpoints must be >= 1")
        _check(self.max_bad_steps >= 1, "train.max_bad_steps must be >= 1")
        _check(self.parallel in ("ddp", "fsdp"), f"train.parallel={self.parallel!r} must be ddp or fsdp")
        bad = [x for x in self.log_to.split(",") if x.strip() and x.strip() not in ("tensorboard", "wandb")]
        _check(not bad, f"train.log_to={self.log_to!r}: {bad[0] if bad else ''!r} is not tensorboard or wandb")
        _check(self.device in ("auto", "cpu", "cuda"), f"train.device={self.device!r} must be auto, cpu or cuda")


@dataclass
class DataConfig:
    source: str = "stdlib"  # path, glob, prepared directory or built-in name
    packing: str = "stream"  # stream: documents joined with BOS, cut into windows; document: BOS + doc start
    val_docs: int = -1  # held-out validation documents; -1 = 10% of documents, at most 256
    test_docs: int = 0
    split_seed: int = 1234  # the split is a fixed function of the corpus, not of the training seed
    max_doc_bytes: int = 65536  # longer documents are cut into pieces before the split
    min_doc_bytes: int = 1  # shorter documents are dropped (the paper keeps > 4096)
    text_field: str = "text"
    # sample language l of the training split with probability proportional to p_l ** (1/T)
    # (p_l: its share of the bytes); 1 = natural shares. Needs per-document languages (the
    # built-in multilingual corpora): rltok/data/languages.py
    language_temperature: float = 1.0

    def validate(self) -> None:
        _check(self.packing in ("stream", "document"),
               f"data.packing={self.packing!r} must be stream or document")
        _check(self.val_docs >= -1 and self.test_docs >= 0, "data.val_docs/test_docs must be >= 0")
        _check(self.max_doc_bytes >= 1, "data.max_doc_bytes must be >= 1")
        _check(self.min_doc_bytes >= 1, "data.min_doc_bytes must be >= 1")
        _check(0 < self.language_temperature < 1e6, f"data.language_temperature={self.language_temperature} must be > 0")


@dataclass
class RunConfig:
    method: str = "rl"
    preset: str = "tiny"
    recipe: str = ""
    model: ModelConfig = field(default_factory=ModelConfig)
    boundary: BoundaryConfig = field(default_factory=BoundaryConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    # a boundary method's stage parts (None for a flat baseline, which has none)
    chunker: ChunkerConfig | None = field(default_factory=ChunkerConfig)
    dechunker: DechunkerConfig | None = field(default_factory=DechunkerConfig)
    # a flat baseline's options (its method's ``MethodSpec.flat_cls``: rltok/flat/); None for a
    # boundary method, whose config then has no flat section
    flat: Any = None

    def sections(self) -> tuple[str, ...]:
        """The config's sections, in order (the parts' for a boundary method, ``flat`` for a flat
        baseline)."""
        parts = ("chunker", "dechunker") if self.flat is None else ()
        return ("model", "boundary", *parts, "train", "data") + (("flat",) if self.flat is not None else ())

    def validate(self) -> "RunConfig":
        for section in self.sections():
            _check_types(getattr(self, section), section)
        t = self.train
        if t.batch_bytes > 0:  # the global batch in bytes wins over batch_size
            _check(t.batch_bytes % self.model.seq_len == 0,
                   f"train.batch_bytes={t.batch_bytes} must be a multiple of model.seq_len={self.model.seq_len}")
            t.batch_size = t.batch_bytes // self.model.seq_len
        self.model.validate()
        self.boundary.validate()
        self.train.validate()
        self.data.validate()
        for section in ("chunker", "dechunker", "flat"):
            if section in self.sections():
                getattr(self, section).validate()
        return self

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for section in ("chunker", "dechunker", "flat"):
            if section not in self.sections():
                del d[section]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @property
    def bytes_per_step(self) -> int:
        return self.train.batch_size * self.model.seq_len

    @property
    def total_steps(self) -> int:
        if self.train.max_steps > 0:
            return self.train.max_steps
        return max(1, math.ceil(self.train.total_bytes / self.bytes_per_step))

    @classmethod
    def from_dict(cls, d: dict[str, Any], boundary_cls: type[BoundaryConfig], strict: bool = False,
                  format_version: int | None = None, flat_cls: type | None = None) -> "RunConfig":
        """A config from its JSON form. ``strict`` (a run directory of format >= 1): unknown keys
        are refused and missing keys named, as ``--set`` refuses a typo, except keys added in a
        format newer than the run's ``format_version`` (``ADDED_KEYS``), which take their
        defaults. Otherwise unknown keys are ignored and missing ones take their defaults.
        ``boundary_cls`` (and ``flat_cls``, a flat baseline's): the method's config classes
        (``rltok.config.run_config_from_dict`` looks them up)."""
        method = d.get("method", "rl")
        _check(isinstance(method, str), f"method={method!r} must be a string")
        cfg = cls(method=method, preset=str(d.get("preset", "")), recipe=str(d.get("recipe", "")),
                  boundary=boundary_cls(), flat=flat_cls() if flat_cls is not None else None)
        if flat_cls is not None:
            cfg.chunker = cfg.dechunker = None
        unknown, missing = [], []
        if strict:
            top = {f.name for f in fields(cls)} | set(VERSION_KEYS)
            unknown += [k for k in d if k not in top]
            missing += [k for k in cfg.sections() if k not in d]
            unknown += [k for k in ("chunker", "dechunker", "flat") if d.get(k) is not None and k not in cfg.sections()]
        for section in cfg.sections():
            obj = getattr(cfg, section)
            known = {f.name for f in fields(obj)}
            values = d.get(section) or {}
            _check(isinstance(values, dict), f"{section!r} must be a JSON object")
            for k, v in values.items():
                if k in known:
                    setattr(obj, k, v)
                elif strict:
                    unknown.append(f"{section}.{k}")
            if strict and section in d:
                fmt = FORMAT_VERSION if format_version is None else format_version
                missing += [f"{section}.{k}" for k in sorted(known - set(values))
                            if ADDED_KEYS.get(f"{section}.{k}", 0) <= fmt]
        if strict and unknown:
            raise RltokError(_keys("unknown", unknown) + " (`rltok train --list-keys` lists the keys)")
        if strict and missing:
            raise RltokError(_keys("missing", missing))
        return cfg


# A run's config.json also records who wrote it. FORMAT_VERSION counts changes to the run
# directory's layout or to the meaning of config keys; a run of a newer format is refused.
FORMAT_VERSION = 14
VERSION_KEYS = ("rltok_version", "format_version")
# keys added after format 1, with the format that added them: an older run lacks them, and they
# take their defaults there (which must reproduce what that run did)
ADDED_KEYS: dict[str, int] = {
    "train.log_to": 2, "train.wandb_project": 2,
    "boundary.rate_schedule": 3, "boundary.flop_price": 3, "boundary.prescribed": 3,
    "boundary.warm_start_bytes": 3, "boundary.is_clip": 3, "dechunker.upsample": 3, "chunker.pool": 3,
    "model.shared_head": 3,
    "data.language_temperature": 4, "boundary.rate_scope": 4, "boundary.match": 4,
    "boundary.rate_control": 4, "boundary.control_gain": 4,
    "model.stages": 5, "model.inner_enc_layers": 5, "model.inner_dec_layers": 5,
    "boundary.inner_target_rate": 5, "boundary.rate_integral_gain": 6,
    "boundary.inner_baseline": 7, "boundary.rate_antiwindup": 9,
    "model.static_chunks": 10, "model.chunk_cap_row": 10, "model.chunk_cap_total": 10, "train.fullgraph": 10,
    # format 11: the U-Net's parameters are named by level (stage.encoder..., stage.router...,
    # stage.inner...; an older checkpoint's flat names are renamed on load), and the compute price
    # moved into the REINFORCE reward (an older run priced in the loss: rltok.config migrates it)
    "boundary.flop_price_in": 11,
    # format 12: the controller's offset as a function of the requested rate (issue 38)
    "boundary.rate_offset_knots": 12,
    # format 13: bpe-lm's FLOP matching with or without the output heads. bytes has had match
    # since format 4 (as boundary.match; format 8 moved the flat baselines' options from boundary.*
    # to flat.* and the stage parts' to dechunker.* and chunker.*, which rltok.config migrates):
    # a bytes run older than 4 lacks it and keeps its shape by its recorded n_layers/mlp_hidden
    "flat.match": 13,
    # format 14: entropy's threshold calibrated on the first training rows, not on the held-out
    # documents (rltok.config gives an older entropy run calibrate_on=heldout, what it did)
    "boundary.calibrate_on": 14, "boundary.em_calibration_rows": 14,
}


def _keys(what: str, keys: list[str]) -> str:
    """'unknown key a.b' / 'missing keys a, b, c ...' (at most five named)."""
    more = " ..." if len(keys) > 5 else ""
    return f"{what} key{'s' if len(keys) > 1 else ''} {', '.join(keys[:5])}{more}"


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise RltokError(message)


def _check_types(obj: Any, section: str) -> None:
    """Every field holds a value of its declared type; numbers are finite and fit in 64 bits
    (whatever set them: a preset, --set, a Python dict or a run's config.json)."""
    hints = typing.get_type_hints(type(obj))
    for f in fields(obj):
        v, tp = getattr(obj, f.name), hints.get(f.name)
        if tp is bool:
            ok, what = isinstance(v, bool), "true or false"
        elif tp is int:
            ok, what = isinstance(v, int) and not isinstance(v, bool) and -2 ** 63 <= v < 2 ** 63, "a 64-bit integer"
        elif tp is float:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            what = "a finite number"
        elif tp is str:
            ok, what = isinstance(v, str), "a string"
        else:
            continue
        _check(ok, f"{section}.{f.name}={v!r} must be {what}")



# methods whose training steers their boundary rate toward boundary.target_rate (the others get
# their rate from a rule or a tokenizer): outputs remark when such a run ends off its target
RATE_TARGETED = ("rl", "uniform", "nawrot", "hnet")


def off_target(method: str, rate: float, target: float, tolerance: float = 0.02) -> bool:
    """Whether a run of ``method`` ended off the rate it was steered to (False for a nan rate and
    for methods that get their rate another way)."""
    return method in RATE_TARGETED and abs(rate - target) > tolerance
def apply_overrides(cfg: RunConfig, overrides: list[str] | dict[str, Any] | None) -> RunConfig:
    if not overrides:
        return cfg
    items = list(overrides.items() if isinstance(overrides, dict) else [_split_kv(s) for s in overrides])
    for key, value in items:
        _apply(cfg, key, value, strict=True)
    keys = {resolve_key(cfg, k) for k, _ in items}
    if "train.batch_size" in keys and "train.batch_bytes" not in keys:
        cfg.train.batch_bytes = 0  # an explicit batch in sequences replaces a preset's batch in bytes
    return cfg


def _split_kv(s: str) -> tuple[str, str]:
    if "=" not in s:
        raise RltokError(f"override {s!r} must look like key=value (e.g. boundary.gamma=1)")
    k, v = s.split("=", 1)
    return k.strip(), v.strip()


def config_keys(cfg: RunConfig) -> list[str]:
    return [f"{sec}.{f.name}" for sec in cfg.sections()
            for f in fields(getattr(cfg, sec))]


def resolve_key(cfg: RunConfig, key: str) -> str | None:
    keys = config_keys(cfg)
    if key in keys:
        return key
    matches = [k for k in keys if k.split(".", 1)[1] == key]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise RltokError(f"override key {key!r} is ambiguous: use one of {', '.join(matches)}")
    return None


def _apply(cfg: RunConfig, key: str, value: Any, strict: bool) -> None:
    full = resolve_key(cfg, key)
    if full is None:
        if strict:
            raise RltokError(f"unknown config key {key!r} for method {cfg.method!r} "
                             f"(see `rltok train --list-keys`)")
        return
    section, name = full.split(".", 1)
    obj = getattr(cfg, section)
    ftype = {f.name: f.type for f in fields(obj)}[name]
    hints = typing.get_type_hints(type(obj))
    setattr(obj, name, _coerce(hints.get(name, ftype), value, full))


def _coerce(tp: Any, value: Any, key: str) -> Any:
    if not isinstance(value, str):
        if tp is float and isinstance(value, int):
            return float(value)
        return value
    v = value.strip()
    try:
        if tp is bool:
            if v.lower() in ("1", "true", "yes", "on"):
                return True
            if v.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(v)
        if tp is int:
            return int(float(v)) if ("e" in v.lower() or "." in v) and float(v).is_integer() else int(v)
        if tp is float:
            if "/" in v:  # allow 1/16
                a, b = v.split("/", 1)
                return float(a) / float(b)
            return float(v)
    except (ValueError, ZeroDivisionError, OverflowError):
        raise RltokError(f"option {key}: cannot read {value!r} as {getattr(tp, '__name__', tp)}") from None
    return v
