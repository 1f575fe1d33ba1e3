"""Sharing models the Hugging Face way: ``save_pretrained``, ``from_pretrained``, ``push_to_hub``.

A saved model is a run directory without its training history::

    DIR/config.json          the RunConfig, with rltok_version and format_version (as in a run)
    DIR/model.safetensors    the weights (metadata: method, and which checkpoint they came from)
    DIR/README.md            a model card: method, training data, rate, held-out bits-per-byte
    DIR/summary.json         the run's final evaluation (only when these are the final weights)
    DIR/<method files>       e.g. tokenizer.json for BPE-guided boundaries

so every rltok command and ``rltok.load`` open it as they open a run. ``from_pretrained`` takes a
local directory or a Hub repo id, downloaded (and cached) by ``huggingface_hub.snapshot_download``;
``push_to_hub`` uploads with ``HfApi.upload_folder``. The model classes get these methods from
:class:`HubMixin`, in the manner of ``huggingface_hub.PyTorchModelHubMixin``; huggingface_hub is
imported only when one of them is called.

    >>> model = rltok.load("runs/tiny")
    >>> model.save_pretrained("export/tiny-rl")
    >>> model = rltok.from_pretrained("export/tiny-rl")     # or "user/tiny-rl" on the Hub
    >>> model.push_to_hub("user/tiny-rl")

``save_pretrained(model, DIR, transformers=True)`` (and ``push_to_hub(..., transformers=True)``)
writes a transformers folder instead (``rltok.hf``: ``AutoModelForCausalLM.from_pretrained(DIR,
trust_remote_code=True)`` loads it without rltok); ``from_pretrained`` reads that too, from its
JSON and safetensors files: no code in a folder is ever imported.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .errors import RltokError
from .version import __version__
from .checkpoint import save_tensors_atomic, write_json_atomic
from .run import load_model, read_summary, write_config

# files of a run that are its history, not part of the model
_HISTORY = {"config.json", "model.safetensors", "metrics.jsonl", "summary.json", ".lock", "README.md"}


def save_pretrained(model, save_directory: str | Path, repo_id: str | None = None, *,
                    transformers: bool = False) -> Path:
    """Write ``model`` (one loaded by ``rltok.load`` or trained by rltok, so that it carries its
    ``run_config``) to ``save_directory`` in the layout of the module docstring.

    ``transformers=True`` writes a transformers folder instead (``rltok.hf.save_for_transformers``:
    ``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`` loads it, rltok not
    needed); ``from_pretrained`` reads both."""
    if transformers:
        from .hf.export import save_for_transformers

        return save_for_transformers(model, save_directory, repo_id=repo_id)
    cfg = getattr(model, "run_config", None)
    if cfg is None:
        raise RltokError("save_pretrained needs a model with its run config (one from rltok.load, "
                         "rltok.from_pretrained or training)")
    out = Path(save_directory)
    run_dir = getattr(model, "run_dir", None)
    if run_dir is not None and out.resolve() == Path(run_dir).resolve():
        raise RltokError(f"{out}: is the model's own run directory; save to another directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RltokError(f"cannot create {out}: {e.strerror or e}") from None
    weights = getattr(model, "weights", None) or {"checkpoint": "in memory", "step": None, "finished": False}
    write_config(out, cfg)
    meta = {"format": "rltok-model-v1", "method": cfg.method, "source_checkpoint": str(weights["checkpoint"]),
            "source_step": str(weights["step"])}
    save_tensors_atomic(out / "model.safetensors", {k: v.detach().cpu() for k, v in model.state_dict().items()},
                        metadata=meta)
    summary = final_summary(model)
    if summary:
        write_json_atomic(out / "summary.json", summary)
    else:
        (out / "summary.json").unlink(missing_ok=True)  # a summary would describe other weights
    if run_dir is not None:
        for f in sorted(Path(run_dir).iterdir()):
            if f.is_file() and f.name not in _HISTORY and not f.name.startswith(".") and not f.name.endswith(".log"):
                shutil.copyfile(f, out / f.name)  # the method's files (a BPE tokenizer, ...)
    model_card(model, summary, repo_id or str(out)).save(out / "README.md")
    return out


def final_summary(model) -> dict | None:
    """The run's summary.json when the model holds that run's final weights, else None (the
    summary's evaluation would describe other weights)."""
    run_dir = getattr(model, "run_dir", None)
    w = getattr(model, "weights", None) or {}
    if run_dir is None or not (w.get("finished") and w.get("checkpoint") == "model.safetensors"):
        return None
    return read_summary(Path(run_dir))


def model_card(model, summary: dict | None = None, name: str = "DIRECTORY_OR_REPO_ID"):
    """A ``huggingface_hub.ModelCard``: metadata (library, tags, metrics) and a page saying what
    the model is, what it was trained on and how it scores."""
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
    return ModelCard(body)


def from_pretrained(name_or_path: str | Path, *, revision: str | None = None, cache_dir: str | Path | None = None,
                    local_files_only: bool = False, token: str | bool | None = None,
                    device: str = "cpu"):
    """The model in a local directory (a saved model, a run, or a transformers export) or a Hub
    repo (downloaded into the Hugging Face cache; ``local_files_only`` or ``HF_HUB_OFFLINE=1``
    reads the cache only). Only JSON and safetensors files are read: no code from the folder
    (a transformers export's ``*.py`` files are for transformers' ``trust_remote_code``) runs."""
    path = Path(name_or_path)
    if not path.is_dir():
        path = Path(_download(str(name_or_path), revision, cache_dir, local_files_only, token))
    export = _transformers_export(path)
    if export is not None:
        return _load_export(path, export, device)
    return load_model(path, device=device)


# -- transformers exports (rltok.hf): read from their JSON and safetensors ---------------------------

def _transformers_export(path: Path) -> dict | None:
    """The parsed config.json of a transformers export (rltok.hf.save_for_transformers), None for
    anything else (a run, a saved model: load_model reads and checks those)."""
    import json

    from .hf.format import is_export

    try:
        d = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return d if is_export(d) else None


def _load_export(path: Path, d: dict, device: str):
    import json

    from .checkpoint import load_tensors
    from .hf.format import PREFIX, build_model, method_files_of, run_config_of
    from .run import check_weights, weights_used

    cfg = run_config_of(d.get("run_config"), str(path / "config.json"))
    model = build_model(cfg, method_files_of(d, str(path / "config.json")))
    index = path / "model.safetensors.index.json"
    if index.is_file():  # transformers shards large models
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError, TypeError) as e:
            raise RltokError(f"{index}: unreadable shard index ({e})") from None
        bad = [s for s in shards if not isinstance(s, str) or Path(s).name != s or not s.endswith(".safetensors")]
        if bad:
            raise RltokError(f"{index}: {bad[0]!r} is not a safetensors file of this folder")
        sources = [path / s for s in shards]
    else:
        sources = [path / "model.safetensors"]
    tensors = {}
    for src in sources:
        if not src.is_file():
            raise RltokError(f"{src}: missing (a transformers export has its weights in safetensors files)")
        for k, v in load_tensors(src).items():
            if not k.startswith(PREFIX):
                raise RltokError(f"{src}: tensor {k} is not the wrapped U-Net's ({PREFIX}...)")
            tensors[k[len(PREFIX):]] = v
    check_weights(model, tensors, sources[0])
    model.load_state_dict(tensors)
    model.run_config = cfg
    model.run_dir = path
    model.weights = weights_used(path, sources[0])
    return model.to(device).eval()


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
                create_pr: bool = False, transformers: bool = False) -> Any:
    """``save_pretrained`` into a temporary directory, then create the repo (if needed) and
    upload it. Returns huggingface_hub's commit info. ``transformers=True`` uploads a
    transformers export (see ``save_pretrained``)."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    repo = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    with tempfile.TemporaryDirectory(prefix="rltok-push-") as tmp:
        save_pretrained(model, tmp, repo_id=repo.repo_id, transformers=transformers)
        return api.upload_folder(repo_id=repo.repo_id, folder_path=tmp, commit_message=commit_message,
                                 revision=revision, create_pr=create_pr, repo_type="model")
