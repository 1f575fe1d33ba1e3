"""Sharing models the Hugging Face way: ``save_pretrained``, ``from_pretrained``, ``push_to_hub``.

A saved model is, by default, a transformers export (``rltok.hf``) that is also an rltok model::

    DIR/config.json              transformers' config (model_type rltok, auto_map), with the RunConfig
                                 in run_config and the method's files (a BPE tokenizer) in method_files
    DIR/model.safetensors        the weights, named model.<rltok name> (transformers' wrapper holds the
                                 U-Net as .model); metadata: method, which checkpoint they came from
    DIR/generation_config.json, DIR/tokenizer_config.json    for transformers' Auto classes
    DIR/*.py                     rltok's modeling code, for transformers' trust_remote_code only
    DIR/README.md                a model card: method, training data, rate, held-out bits-per-byte
    DIR/summary.json             the run's final evaluation (only when these are the final weights)

so that ``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`` loads it where rltok
is not installed, and every rltok command and ``rltok.load`` open it as they open a run, reading
only its JSON and safetensors files (``rltok.run.load_model``): no code in a folder is ever
imported. Writing it needs no transformers (``rltok.hf.bundle``).

The flat baselines (``bytes``, ``bpe-lm``) have no transformers export: for them (and with
``transformers=False`` for any model) the saved model is the run layout without its history::

    DIR/config.json          the RunConfig, with rltok_version and format_version (as in a run)
    DIR/model.safetensors    the weights (metadata: method, and which checkpoint they came from)
    DIR/README.md, DIR/summary.json    as above
    DIR/<method files>       e.g. tokenizer.json for BPE-guided boundaries

``from_pretrained`` takes a local directory (either layout, or a run) or a Hub repo id, downloaded
(and cached) by ``huggingface_hub.snapshot_download``; ``push_to_hub`` uploads with
``HfApi.upload_folder``. The model classes get these methods from :class:`HubMixin`, in the manner
of ``huggingface_hub.PyTorchModelHubMixin``; huggingface_hub is imported only when one of them is
called.

    >>> model = rltok.load("runs/tiny")
    >>> model.save_pretrained("export/tiny-rl")
    >>> model = rltok.from_pretrained("export/tiny-rl")     # or "user/tiny-rl" on the Hub
    >>> model.push_to_hub("user/tiny-rl")
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

from .errors import RltokError
from .version import __version__
from .checkpoint import save_tensors_atomic, write_bytes_atomic, write_json_atomic
from .run import CONFIG, HISTORY, LOCK, MODEL, load_model, method_files, read_config, read_export, read_summary, write_config

_HISTORY = HISTORY  # files of a run that are its history, not part of the model
# what a transformers export holds besides config.json, model.safetensors, README.md, summary.json
_EXPORT_ONLY = ("generation_config.json", "tokenizer_config.json", "model.safetensors.index.json")


def save_pretrained(model, save_directory: str | Path, repo_id: str | None = None, *,
                    transformers: bool | None = None) -> Path:
    """Write ``model`` (one loaded by ``rltok.load`` or trained by rltok, so that it carries its
    ``run_config``) to ``save_directory``: a transformers export that rltok reads too (module
    docstring; ``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`` loads it,
    rltok not needed), or, for the flat baselines (bytes, bpe-lm), which have no transformers
    export, the run layout. ``transformers=False`` writes the run layout for any model;
    ``transformers=True`` the export, and raises for a flat baseline. ``from_pretrained`` and
    every rltok command read both. ``repo_id`` names the model in the card's examples."""
    return _save(model, save_directory, repo_id, transformers=transformers)


def _save(model, save_directory: str | Path, repo_id: str | None, *, transformers: bool | None,
          boundary_mode: str = "greedy", files: dict[str, str] | None = None) -> Path:
    from .hf.bundle import check_exportable, is_exportable, write_export

    cfg = getattr(model, "run_config", None)
    if cfg is None:
        raise RltokError("save_pretrained needs a model with its run config (one from rltok.load, "
                         "rltok.from_pretrained or training)")
    export = is_exportable(model) if transformers is None else bool(transformers)
    if export:
        check_exportable(model)
    out = Path(save_directory)
    run_dir = getattr(model, "run_dir", None)
    if run_dir is not None and out.resolve() == Path(run_dir).resolve():
        raise RltokError(f"{out}: is the model's own run directory; save to another directory")
    if export and files is None:
        files = method_files(Path(run_dir), text=True) if run_dir is not None else {}
    elif not export:
        files = method_files(Path(run_dir)) if run_dir is not None else {}
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RltokError(f"cannot create {out}: {e.strerror or e}") from None
    weights = getattr(model, "weights", None) or {"checkpoint": "in memory", "step": None, "finished": False}
    meta = {"format": "pt", "method": cfg.method, "source_checkpoint": str(weights["checkpoint"]),
            "source_step": str(weights["step"])}
    stale = _other_layout(out, export)
    if export:
        write_export(model, out, files, boundary_mode=boundary_mode, metadata=meta)
    else:
        write_config(out, cfg)
        save_tensors_atomic(out / MODEL, {k: v.detach().cpu() for k, v in model.state_dict().items()},
                            metadata={**meta, "format": "rltok-model-v1"})
        for name, data in files.items():  # the method's files (a BPE tokenizer, ...)
            write_bytes_atomic(out / name, data)
    summary = final_summary(model)
    if summary:
        write_json_atomic(out / "summary.json", summary)
    else:
        (out / "summary.json").unlink(missing_ok=True)  # a summary would describe other weights
    model_card(model, summary, repo_id or str(out), transformers=export).save(out / "README.md")
    for f in stale:
        if export or f.name not in files:
            f.unlink(missing_ok=True)
    return out


def _other_layout(out: Path, export: bool) -> list[Path]:
    """Saving over an earlier save of the other layout: the files of that layout that the new one
    does not overwrite, to be removed (an export's code and JSON files; a saved run layout's
    method files, one of which, tokenizer.json, transformers would take for a tokenizer of its
    own). Only an rltok save is touched: not a run with its history, nor a folder whose
    config.json is not rltok's."""
    if not (out / CONFIG).is_file() or any((out / n).exists() for n in ("metrics.jsonl", "checkpoints", LOCK)):
        return []
    from .hf.bundle import is_bundled_file

    if read_export(out) is not None:
        if export:
            return []
        return [out / n for n in _EXPORT_ONLY] + [f for f in out.glob("*.py") if is_bundled_file(f)]
    if not export:
        return []
    try:
        d = json.loads((out / CONFIG).read_text())
        if not (isinstance(d, dict) and "rltok_version" in d and "method" in d):
            return []  # not written by rltok's save_pretrained
        read_config(out)
        return [out / n for n in method_files(out)]
    except (OSError, ValueError, RltokError):
        return []


def final_summary(model) -> dict | None:
    """The run's summary.json when the model holds that run's final weights, else None (the
    summary's evaluation would describe other weights)."""
    run_dir = getattr(model, "run_dir", None)
    w = getattr(model, "weights", None) or {}
    if run_dir is None or not (w.get("finished") and w.get("checkpoint") == "model.safetensors"):
        return None
    return read_summary(Path(run_dir))


def model_card(model, summary: dict | None = None, name: str = "DIRECTORY_OR_REPO_ID", *,
               transformers: bool = False):
    """A ``huggingface_hub.ModelCard``: metadata (library, tags, metrics) and a page saying what
    the model is, what it was trained on and how it scores; ``transformers=True``: the card of a
    transformers export (library transformers, custom_code, how to load it both ways)."""
    from huggingface_hub import ModelCard, ModelCardData

    cfg = model.run_config
    w = getattr(model, "weights", None) or {}
    mc = cfg.model
    n = sum(p.numel() for p in model.parameters())
    s = summary or {}

    def num(key, fmt):
        v = s.get(key)
        return format(v, fmt) if isinstance(v, (int, float)) and math.isfinite(v) else "n/a"

    data = ModelCardData(library_name="rltok", pipeline_tag="text-generation", license="apache-2.0",
                         tags=["rltok", "byte-level", "learned-tokenization", f"method-{cfg.method}"])
    step = f" (step {w['step']})" if w.get("step") is not None else ""
    state = ("the final weights of a finished run" if summary else
             f"weights from {w.get('checkpoint', 'memory')}{step} of a run that had not finished: "
             f"no final evaluation is recorded")
    body = f"""---
{data.to_yaml()}
---

# {cfg.method} byte-level model ({cfg.preset or 'custom'} preset), trained with rltok

A byte-level autoregressive U-Net whose chunk boundaries ("tokens") are chosen by the
`{cfg.method}` boundary method, trained with rltok, an implementation of *You Can Learn
Tokenization End-to-End with Reinforcement Learning* (Dauncey & Wattenhofer, ICML 2026). These are {state}.

| | |
|---|---|
| method | `{cfg.method}` (target rate {cfg.boundary.target_rate} boundaries per byte) |
| parameters | {n:,} (d_model {mc.d_model}, layers {mc.enc_layers}+{mc.main_layers}+{mc.dec_layers}, context {mc.seq_len} bytes) |
| training data | `{cfg.data.source}`, {s.get('bytes', cfg.train.total_bytes):,} bytes, seed {cfg.train.seed} |
| held-out bits/byte | {num('val_bpb', '.4f')} ± {num('val_bpb_se', '.4f')} (mean over {s.get('val_docs', 'n/a')} validation documents ± SE; first {mc.seq_len} bytes of each) |
| boundary rate | {num('val_rate', '.3f')} per byte on the validation documents |
| whitespace recall | {num('val_whitespace_recall', '.3f')} |
| written by | rltok {__version__} |

## Use

```python
import rltok
model = rltok.from_pretrained("{name}")
rltok.segment(model, "The city council met on Tuesday.")   # the chunks it draws
rltok.encode(model, "The city council met on Tuesday.").offsets  # as byte offsets
```

The directory is also an rltok run: `rltok eval DIR`, `rltok generate DIR --prompt ...`.
"""
    if transformers:
        body = _export_card(body, name)
    return ModelCard(body)


def _export_card(body: str, name: str) -> str:
    """The card of a transformers export: transformers' metadata, and how to load it both ways."""
    body = body.replace("library_name: rltok", "library_name: transformers", 1)
    body = body.replace("- rltok\n", "- rltok\n- custom_code\n", 1)
    head = body.split("\n## Use\n", 1)[0].rstrip("\n")
    return head + f"""

## Use

With transformers (rltok need not be installed; the folder carries rltok's modeling code):

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained("{name}", trust_remote_code=True)
tok = AutoTokenizer.from_pretrained("{name}", trust_remote_code=True)
ids = tok("The city council", return_tensors="pt").input_ids   # BOS + UTF-8 bytes
out = model.generate(ids, max_new_tokens=64, do_sample=True, temperature=0.8, seed=0, boundary_mode="sample")
print(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
```

`generate` is rltok's cached decoding: the same bytes as `rltok generate --dtype fp32
--temperature 0.8 --seed 0` here. Boundaries are greedy (probability > 0.5) unless
`boundary_mode="sample"`, in `generate` and in the forward pass, whose next-byte logits are
rltok's (lm-eval's `hf` backend scores as `rltok-lm-eval --model_args greedy_boundaries=true`).

With rltok, which reads only the JSON and safetensors files (no code from the folder):

```python
import rltok
model = rltok.from_pretrained("{name}")
rltok.segment(model, "The city council met on Tuesday.")
```

The folder is also an rltok run: `rltok eval DIR`, `rltok generate DIR --prompt ...`.
"""


def from_pretrained(name_or_path: str | Path, *, revision: str | None = None, cache_dir: str | Path | None = None,
                    local_files_only: bool = False, token: str | bool | None = None,
                    device: str = "cpu"):
    """The model in a local directory (a saved model of either layout, or a run) or a Hub repo
    (downloaded into the Hugging Face cache; ``local_files_only`` or ``HF_HUB_OFFLINE=1`` reads
    the cache only): ``rltok.run.load_model``, which reads only JSON and safetensors files, so
    no code from the folder (a transformers export's ``*.py`` files are for transformers'
    ``trust_remote_code``) runs."""
    path = Path(name_or_path)
    if not path.is_dir():
        path = Path(_download(str(name_or_path), revision, cache_dir, local_files_only, token))
    return load_model(path, device=device)


def _download(repo_id: str, revision, cache_dir, local_files_only, token) -> str:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalEntryNotFoundError

    try:
        return snapshot_download(repo_id=repo_id, revision=revision, cache_dir=cache_dir,
                                 local_files_only=local_files_only, token=token)
    except HFValidationError:
        raise RltokError(f"{repo_id}: neither a local directory nor a valid Hub repo id") from None
    except LocalEntryNotFoundError:
        raise RltokError(f"{repo_id}: not a local directory, and not in the Hugging Face cache "
                         f"(offline, or the Hub cannot be reached)") from None
    except HfHubHTTPError as e:
        raise RltokError(f"{repo_id}: cannot download from the Hub ({str(e).splitlines()[0]})") from None


def push_to_hub(model, repo_id: str, *, private: bool | None = None, token: str | None = None,
                commit_message: str = "Upload rltok model", revision: str | None = None,
                create_pr: bool = False, transformers: bool | None = None) -> Any:
    """``save_pretrained`` into a temporary directory, then create the repo (if needed) and
    upload it. Returns huggingface_hub's commit info. ``transformers``: which layout, as in
    ``save_pretrained`` (by default a transformers export, the run layout for a flat baseline)."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    repo = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    with tempfile.TemporaryDirectory(prefix="rltok-push-") as tmp:
        save_pretrained(model, tmp, repo_id=repo.repo_id, transformers=transformers)
        return api.upload_folder(repo_id=repo.repo_id, folder_path=tmp, commit_message=commit_message,
                                 revision=revision, create_pr=create_pr, repo_type="model")
