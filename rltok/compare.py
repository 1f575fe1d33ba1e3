"""``rltok compare``: every boundary method in one compute-matched harness.

A comparison is a list of *variants* (a method with optional config overrides) times a list of
seeds. Every run uses the same preset, data, byte budget and schedule; runs with the same seed see
the same data in the same order with the same noise uniforms (both are functions of the seed and
the step, see data/loader.py), so methods differ only in how they draw boundaries.

Layout of the output directory::

    DIR/compare.json                the plan (for the record)
    DIR/bpe_reference.json          BPE fitted to r* on the training split: BPE-F1, and the
                                    tokenizer of the bpe and bpe-lm variants
    DIR/runs/<tag>/seed<k>/         an ordinary run directory (rltok eval/analyze work on it)
    DIR/runs/<tag>/seed<k>/compare_eval.json   its evaluation on the comparison's documents
    DIR/results.json, results.md, curves.png

Re-running the same command skips finished runs (their configs must match), resumes unfinished
ones from their newest checkpoint, and re-evaluates only what changed.

Variant syntax (``--methods``, comma separated)::

    METHOD[:KEY=VALUE[:KEY=VALUE...]][@TAG]

KEY is any ``--set`` key (bare names resolve when unique: ``rl:gamma=1``), or ``policy_scale``
(alias of ``boundary.scale``), or ``seeds=N`` to use only the first N of ``--seeds``.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from .schema import PAD, RunConfig, _split_kv, apply_overrides, resolve_key
from .config import build_config
from .errors import RltokError
from . import bpe as bpe_lib
from .bpe import TokenizerOptions
from .boundaries.bpe import BoundaryCache, bpe_boundaries_for_ids
from .checkpoint import write_json_atomic
from .data import load_splits
from .data.sources import load_corpus
from .locks import held
from .evaluate import evaluate_corpus
from .flops import training_flops_per_byte
from .metrics import read_metrics
from .model.chunking import decided_mask
from .objectives import level_key
from .run import SUMMARY, is_finished, is_run, load_model, read_config, read_summary
from .train import train

ALIASES = {"policy_scale": "boundary.scale"}
SETUP_FILLED = {"flat.n_layers", "flat.mlp_hidden", "flat.token_rate"}  # 0 = chosen at setup
IGNORED_ON_MATCH = {"train.device"}
BPE_REFERENCE = "bpe_reference.json"
EVAL_FILE = "compare_eval.json"
EVAL_VERSION = 2  # bump when evaluations gain fields, so cached ones are recomputed (2: word-start recall)
_TAG_SAFE = re.compile(r"[^A-Za-z0-9._=+-]")


@dataclass
class Variant:
    method: str
    overrides: dict[str, str] = field(default_factory=dict)
    tag: str = ""
    n_seeds: int = 0  # 0: all seeds of the comparison
    text: str = ""  # as written on the command line


def parse_variant(text: str) -> Variant:
    raw = text.strip()
    if not raw:
        raise RltokError("--methods: empty method name (check for a stray comma)")
    body, at, tag = raw.partition("@")
    if at and not tag.strip():
        raise RltokError(f"--methods {raw!r}: empty tag after @")
    method, *items = body.split(":")
    method = method.strip()
    overrides: dict[str, str] = {}
    n_seeds = 0
    for item in items:
        if "=" not in item:
            raise RltokError(f"--methods {raw!r}: {item!r} must look like key=value (e.g. rl:gamma=1)")
        k, v = (s.strip() for s in item.split("=", 1))
        if k == "seeds":
            try:
                n_seeds = int(v)
            except ValueError:
                n_seeds = -1
            if n_seeds < 1:
                raise RltokError(f"--methods {raw!r}: seeds={v} must be a positive number of seeds")
            continue
        overrides[ALIASES.get(k, k)] = v
    if not tag:
        tag = method + "".join(f"_{k.split('.')[-1]}={v}" for k, v in overrides.items())
    tag = _TAG_SAFE.sub("-", tag.strip())
    if not tag:
        raise RltokError(f"--methods {raw!r}: empty tag after @")
    return Variant(method=method, overrides=overrides, tag=tag, n_seeds=n_seeds, text=raw)


def parse_variants(text: str) -> list[Variant]:
    variants = [parse_variant(t) for t in text.split(",")]
    seen: dict[str, str] = {}
    for v in variants:
        if v.tag in seen:
            raise RltokError(f"--methods: {seen[v.tag]!r} and {v.text!r} have the same tag {v.tag!r}; "
                             f"name one with @TAG")
        seen[v.tag] = v.text
    return variants


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise RltokError(f"--seeds {text!r} must be comma-separated integers (e.g. 1,2,3)") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise RltokError(f"--seeds {text!r} must list distinct integers")
    if not all(0 <= s < 2 ** 63 for s in seeds):
        raise RltokError(f"--seeds {text!r}: seeds must be in [0, 2**63)")
    return seeds


@dataclass
class CompareSpec:
    variants: list[Variant]
    out: Path
    preset: str = "tiny"
    recipe: str = ""
    data: str | None = None  # None: the preset's data source
    total_bytes: int | None = None  # None: the preset's
    seeds: list[int] = field(default_factory=lambda: [1])
    overrides: list[str] = field(default_factory=list)  # --set, applied to every variant
    eval_data: str | None = None  # None: the validation split of the training data
    eval_docs: int | None = None  # None: all of them
    eval_samples: int = 1
    eval_batch_size: int = 8
    eval_seed: int = 0
    baseline: str | None = None  # tag (or method) for the paired-difference column
    device: str | None = None


@dataclass
class PlannedRun:
    variant: Variant
    seed: int
    cfg: RunConfig
    run_dir: Path


def _base_overrides(spec: CompareSpec, seed: int) -> dict[str, Any]:
    o: dict[str, Any] = {"train.seed": seed}
    if spec.data is not None:
        o["data.source"] = spec.data
    if spec.total_bytes is not None:
        o["train.total_bytes"] = spec.total_bytes
        o["train.max_steps"] = 0
    if spec.device is not None:
        o["train.device"] = spec.device
    return o


def build_variant_config(spec: CompareSpec, v: Variant, seed: int, bpe_reference: Path | None) -> RunConfig:
    try:
        cfg = build_config(v.method, spec.preset, spec.recipe, _base_overrides(spec, seed))
        # --set applies to every method that has the key (plan() rejects keys that none has)
        apply_overrides(cfg, [s for s in spec.overrides if resolve_key(cfg, _split_kv(s)[0]) is not None])
        # the comparison's reference BPE is the tokenizer of bpe and bpe-lm unless the variant says otherwise
        # (bpe guidance's boundary.tokenizer, the token LM's flat.tokenizer)
        tok_opts = next((o for o in (cfg.boundary, cfg.flat) if isinstance(o, TokenizerOptions)), None)
        if (bpe_reference is not None and tok_opts is not None
                and not any(k.split(".")[-1] in ("tokenizer", "vocab_size") for k in v.overrides)):
            tok_opts.tokenizer = str(bpe_reference)
        apply_overrides(cfg, dict(v.overrides))
        return cfg.validate()
    except RltokError as e:
        raise RltokError(f"--methods {v.text!r}: {e}") from None


def plan(spec: CompareSpec, bpe_reference: Path | None = None) -> list[PlannedRun]:
    """Every (variant, seed) run with its resolved config, seed-major: all methods with the first
    seed come first, so an interrupted comparison has one complete seed early."""
    runs = []
    for s in spec.overrides:
        key = _split_kv(s)[0]
        if not any(resolve_key(build_config(v.method, spec.preset, spec.recipe), key) for v in spec.variants):
            raise RltokError(f"--set {s}: no compared method has a config key {key!r} "
                             f"(see `rltok train --method NAME --list-keys`)")
    for seed in spec.seeds:
        for v in spec.variants:
            seeds = spec.seeds[: v.n_seeds] if v.n_seeds else spec.seeds
            if seed not in seeds:
                continue
            cfg = build_variant_config(spec, v, seed, bpe_reference)
            runs.append(PlannedRun(v, seed, cfg, spec.out / "runs" / v.tag / f"seed{seed}"))
    return runs


# -- resumability ---------------------------------------------------------------------------------

def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def config_mismatch(saved: RunConfig, wanted: RunConfig) -> str | None:
    """The first setting in which a saved run differs from what the comparison wants, or None."""
    a, b = _flatten(saved.to_dict()), _flatten(wanted.to_dict())
    for key in sorted(set(a) | set(b)):
        if key in IGNORED_ON_MATCH:
            continue
        if key in SETUP_FILLED and b.get(key) in (0, 0.0):
            continue
        if key in ("boundary.tokenizer", "flat.tokenizer"):  # the tokenizer file is copied into the run
            continue
        if a.get(key) != b.get(key):
            return f"{key} = {a.get(key)!r} in the run, {b.get(key)!r} wanted"
    return None


# -- evaluation ---------------------------------------------------------------------------------

class BpeAgreement:
    """Precision/recall of a run's boundaries against the reference BPE's, counted at decided
    positions (not the forced first/last, not padding) of the evaluation documents."""

    def __init__(self, tokenizer):
        self.cache = BoundaryCache(tokenizer)
        self.tp = self.n_pred = self.n_ref = 0

    def __call__(self, idx, batch, out, sample) -> None:
        if out.boundaries is None:
            return

        ids = batch.ids.cpu()
        ref = torch.from_numpy(bpe_boundaries_for_ids(self.cache, ids.numpy()))
        dec = decided_mask(ids != PAD)
        pred = out.boundaries.cpu().bool() & dec
        ref = ref & dec
        self.tp += int((pred & ref).sum())
        self.n_pred += int(pred.sum())
        self.n_ref += int(ref.sum())

    def result(self) -> dict[str, float]:
        if self.n_pred + self.n_ref == 0:
            return {"bpe_precision": float("nan"), "bpe_recall": float("nan"), "bpe_f1": float("nan")}
        p = self.tp / self.n_pred if self.n_pred else float("nan")
        r = self.tp / self.n_ref if self.n_ref else float("nan")
        f1 = 2 * self.tp / (self.n_pred + self.n_ref)
        return {"bpe_precision": p, "bpe_recall": r, "bpe_f1": f1}


def eval_key(spec: CompareSpec, corpus_name: str, n_docs: int, reference_sha: str) -> dict[str, Any]:
    return {"eval_version": EVAL_VERSION, "eval_data": corpus_name, "docs": n_docs, "samples": spec.eval_samples,
            "seed": spec.eval_seed, "bpe_reference_sha256": reference_sha}


def evaluate_run(run: PlannedRun, corpus, spec: CompareSpec, key: dict, tokenizer, device: torch.device) -> dict:
    """Evaluate a finished run on the comparison's documents (cached in the run directory)."""
    path = run.run_dir / EVAL_FILE
    if path.is_file():
        try:
            cached = json.loads(path.read_text())
            if cached.get("key") == key and _summary_mtime(run.run_dir) == cached.get("summary_mtime"):
                return cached["result"]
        except (json.JSONDecodeError, OSError):
            pass
    model = load_model(run.run_dir, device=device)
    agree = BpeAgreement(tokenizer) if tokenizer is not None else None
    res = evaluate_corpus(model, corpus, model.run_config.model.seq_len, docs=key["docs"],
                          samples=spec.eval_samples, seed=spec.eval_seed, batch_size=spec.eval_batch_size,
                          dtype=model.run_config.train.dtype, on_batch=agree)
    out = res.to_dict(per_doc=True)
    out.update(agree.result() if agree is not None else
               {"bpe_precision": float("nan"), "bpe_recall": float("nan"), "bpe_f1": float("nan")})
    out.update(training_record(run.run_dir, model))

    write_json_atomic(path, {"key": key, "summary_mtime": _summary_mtime(run.run_dir), "result": out})
    return out


def _summary_mtime(run_dir: Path) -> float:
    p = run_dir / SUMMARY
    return p.stat().st_mtime if p.exists() else 0.0


def training_record(run_dir: Path, model) -> dict[str, Any]:
    """Training rate, throughput, parameters and FLOPs of a finished run."""
    summary = read_summary(run_dir) or {}
    steps = [r for r in read_metrics(run_dir) if "event" not in r]
    rates = [r["rate"] for r in steps if isinstance(r.get("rate"), (int, float)) and math.isfinite(r["rate"])]
    bps = [r["bytes_per_s"] for r in steps if isinstance(r.get("bytes_per_s"), (int, float))]
    train_rate = float(np.mean(rates)) if rates else None
    # the rate over the second half of training: where a rate-matched comparison must hold r*
    late = [r["rate"] for r in steps if isinstance(r.get("rate"), (int, float)) and math.isfinite(r["rate"])
            and r.get("bytes", 0) > summary.get("bytes", 0) / 2]
    inner = []  # each deeper level's mean achieved rate, level 1 first
    for k in range(1, getattr(getattr(model, "cfg", None), "stages", 1)):  # (a flat baseline has no cfg)
        key = level_key(k, "rate")
        got = [r[key] for r in steps if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
        if not got:
            break
        inner.append(float(np.mean(got)))
    # at the achieved rate (chunks or tokens per byte; the flat byte LM has none and ignores it)
    fc = training_flops_per_byte(model, model.run_config, train_rate, inner or None)
    n_bytes = int(summary.get("bytes", 0))
    return {
        "train_rate": train_rate, "train_rate_late": float(np.mean(late)) if late else None,
        "target_rate": float(getattr(model.run_config.boundary, "target_rate", float("nan"))),
        "bytes_per_s": float(np.median(bps)) if bps else float("nan"),
        "params": int(summary.get("params", sum(p.numel() for p in model.parameters()))),
        "train_bytes": n_bytes, "train_seconds": summary.get("train_seconds"),
        "flops_per_byte": fc.per_byte, "train_flops": fc.total(n_bytes), "flops": fc.to_dict(),
    }


# -- the driver ---------------------------------------------------------------------------------

def _reference_bpe(spec: CompareSpec, base: RunConfig, train_corpus, log: Callable[[str], None]) -> Path:
    """DIR/bpe_reference.json: a BPE fitted to the target rate on the training split (made once)."""
    path = spec.out / BPE_REFERENCE
    if path.is_file():
        return path
    # two compares sharing a DIR fit it once; the second waits and reads the first's file
    with held(path.with_name(path.name + ".lock")):
        if path.is_file():
            return path
        log(f"compare: fitting the reference BPE to rate {base.boundary.target_rate} on the training split")
        tok, size, rate = bpe_lib.fit_bpe_to_rate(bpe_lib.fit_docs(train_corpus, 20_000_000),
                                                  base.boundary.target_rate)
        bpe_lib.save_tokenizer(tok, path, {"vocab_size": size, "rate": rate,
                                           "target_rate": base.boundary.target_rate,
                                           "rate_measured_on": "held-out 10% of the fitting documents"})
    log(f"compare: reference BPE vocabulary {size:,}, {rate:.4f} tokens per byte")
    return path


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_compare(spec: CompareSpec, *, train_runs: bool = True, progress: bool = True,
                log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Train what is missing, evaluate every run, write the results. Returns results.json's
    content; ``results["exit_code"]`` is non-zero when training was interrupted."""
    import os

    from .compare_report import aggregate, write_reports
    from .distributed import resolve_device

    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise RltokError("rltok compare runs its trainings one after another in one process; "
                         "do not start it under torchrun")
    if spec.baseline and spec.baseline not in {v.tag for v in spec.variants} | {v.method for v in spec.variants}:
        raise RltokError(f"--baseline {spec.baseline!r} is not one of the compared methods")
    plan(spec)  # validates every variant before any work
    spec.out.mkdir(parents=True, exist_ok=True)
    base = build_variant_config(spec, Variant(method="uniform", text="uniform"), spec.seeds[0], None)
    splits_cache: dict[str, Any] = {}

    def splits_for(cfg: RunConfig):
        k = json.dumps(asdict(cfg.data), sort_keys=True)
        if k not in splits_cache:
            splits_cache[k] = load_splits(cfg)
        return splits_cache[k]

    base_splits = splits_for(base)
    ref_path = _reference_bpe(spec, base, base_splits.train, log).resolve()
    ref_tok = bpe_lib.load_tokenizer(ref_path)
    runs = plan(spec, ref_path)

    write_json_atomic(spec.out / "compare.json", {
        "preset": spec.preset, "recipe": spec.recipe, "data": base.data.source,
        "bytes": base.train.total_bytes if base.train.max_steps == 0 else None,
        "seeds": spec.seeds, "methods": [v.text for v in spec.variants], "set": spec.overrides,
        "eval_data": spec.eval_data, "eval_docs": spec.eval_docs, "baseline": spec.baseline})

    if spec.eval_data:
        corpus = load_corpus(spec.eval_data, base.data)
        corpus_name = spec.eval_data
    else:
        corpus = base_splits.val
        corpus_name = f"{base.data.source} [validation split]"
    n_docs = len(corpus) if spec.eval_docs is None else min(spec.eval_docs, len(corpus))
    if n_docs == 0:
        raise RltokError(f"no evaluation documents in {corpus_name}")
    key = eval_key(spec, corpus_name, n_docs, _sha256(ref_path))
    device = resolve_device(base.train.device)

    exit_code = 0
    records: list[dict[str, Any]] = []
    for i, run in enumerate(runs, 1):
        head = f"[{i}/{len(runs)}] {run.variant.tag} seed {run.seed}"
        if is_finished(run.run_dir):
            why = config_mismatch(read_config(run.run_dir), run.cfg)
            if why:
                raise RltokError(f"{run.run_dir} was trained with different settings ({why}); "
                                 f"remove it or use another --out")
            log(f"{head}: finished, skipped")
        elif not train_runs:
            log(f"{head}: not trained yet (--no-train)")
            continue
        else:
            resume = is_run(run.run_dir)
            if resume:
                why = config_mismatch(read_config(run.run_dir), run.cfg)
                if why and not why.startswith("train.total_bytes"):
                    raise RltokError(f"{run.run_dir} was started with different settings ({why}); "
                                     f"remove it or use another --out")
            log(f"{head}: {'resuming' if resume else 'training'} in {run.run_dir}")
            t0 = time.perf_counter()
            res = train(run.cfg, run.run_dir, resume=resume, progress=progress, splits=splits_for(run.cfg))
            if res.exit_code != 0:
                log(f"{head}: interrupted; run the same command again to continue")
                exit_code = res.exit_code
                break
            log(f"{head}: trained in {time.perf_counter() - t0:.0f} s")
        rec = evaluate_run(run, corpus, spec, key, ref_tok, device)
        rec.update(tag=run.variant.tag, method=run.variant.method, seed=run.seed,
                   overrides=run.variant.overrides, run_dir=str(run.run_dir))
        records.append(rec)
        log(f"{head}: bpb {rec['bpb']:.4f} ± {rec['bpb_se']:.4f}, rate {rec['rate']:.3f}")

    results = aggregate(spec, records, corpus_name, n_docs, ref_path)
    results["exit_code"] = exit_code
    write_reports(spec.out, results, records)
    return results
