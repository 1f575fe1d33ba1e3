"""Checkpoints: safetensors for tensors, JSON for everything else; never pickle.

A checkpoint is a directory ``RUN/checkpoints/step_XXXXXXXX/`` holding ``model.safetensors``,
``optim.safetensors`` (AdamW moments), ``state.json`` (step, bytes seen, schedule, RNG state as
numbers, optimizer hyper-parameters) and ``manifest.json`` (size and sha256 of each file).

Writing is atomic: files go to a temporary directory, each is fsynced, the manifest is written
last, and the directory is renamed into place (then the parent is fsynced). A reader therefore
sees either a complete checkpoint or none; a damaged one (truncated, corrupted, edited) fails its
manifest check and is reported, and resuming falls back to the newest valid one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .errors import RltokError

FORMAT = "rltok-checkpoint-v1"
CKPT_DIR = "checkpoints"


class CheckpointError(RltokError):
    pass


# -- atomic file primitives ------------------------------------------------------------------------

def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def write_bytes_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def write_json_atomic(path: Path, obj: Any) -> None:
    write_bytes_atomic(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def save_tensors_atomic(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        save_file(_contiguous(tensors), str(tmp), metadata=metadata)
        _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _contiguous(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Load a safetensors file; anything else (a pickle, a truncated file) is refused."""
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{path}: not a valid safetensors file ({str(e).splitlines()[0][:200]})") from None


# -- optimizer state <-> tensors + JSON ------------------------------------------------------------

def optimizer_state(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    sd = opt.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for pid, st in sd["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"state.{pid}.{k}"] = v
            else:
                scalars.setdefault(str(pid), {})[k] = v
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def load_optimizer_state(opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    state: dict[int, dict[str, Any]] = {}
    for key, v in tensors.items():
        _, pid, k = key.split(".", 2)
        state.setdefault(int(pid), {})[k] = v
    for pid, kv in meta.get("scalars", {}).items():
        state.setdefault(int(pid), {}).update(kv)
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


# -- checkpoints -------------------------------------------------------------------------------------

def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CKPT_DIR


def list_checkpoints(run_dir: Path) -> list[Path]:
    d = checkpoint_dir(run_dir)
    if not d.is_dir():
        return []
    out = [p for p in d.iterdir() if p.is_dir() and p.name.startswith("step_") and p.name[5:].isdigit()]
    return sorted(out, key=lambda p: int(p.name[5:]))


def save_checkpoint(run_dir: Path, step: int, model_tensors: dict[str, torch.Tensor],
                    optim: tuple[dict[str, torch.Tensor], dict[str, Any]], state: dict[str, Any],
                    keep: int) -> Path:
    """Write checkpoint ``step`` atomically and keep the newest ``keep`` checkpoints.

    On failure (disk full, read-only directory) the temporary directory is removed, earlier
    checkpoints are untouched, and a CheckpointError names the location and the cause.
    """
    root = checkpoint_dir(run_dir)
    final = root / f"step_{step:08d}"
    tmp = root / f".tmp-step_{step:08d}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        optim_tensors, optim_meta = optim
        save_file(_contiguous(model_tensors), str(tmp / "model.safetensors"), metadata={"format": FORMAT})
        save_file(_contiguous(optim_tensors), str(tmp / "optim.safetensors"), metadata={"format": FORMAT})
        (tmp / "state.json").write_text(json.dumps({**state, "optimizer": optim_meta}, indent=2, sort_keys=True))
        files = {}
        for name in ("model.safetensors", "optim.safetensors", "state.json"):
            _fsync_file(tmp / name)
            files[name] = {"size": (tmp / name).stat().st_size, "sha256": sha256_file(tmp / name)}
        manifest = {"format": FORMAT, "step": step, "files": files}
        with open(tmp / "manifest.json", "w") as f:
            json.dump(manifest, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        if final.exists():  # re-saving the same step: move the old one aside first
            trash = root / f".old-{final.name}-{os.getpid()}"
            os.replace(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(tmp, final)
        _fsync_dir(root)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"cannot write checkpoint to {final}: {e.strerror or e}; "
                              f"earlier checkpoints are intact") from None
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def verify_checkpoint(path: Path) -> dict[str, Any]:
    """Check the manifest (presence, sizes, sha256). Returns it; raises CheckpointError."""
    man_path = path / "manifest.json"
    try:
        manifest = json.loads(man_path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: incomplete checkpoint (no manifest.json)") from None
    except (json.JSONDecodeError, UnicodeDecodeError, OSError):
        raise CheckpointError(f"{man_path}: unreadable manifest") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(f"{man_path}: not an rltok checkpoint manifest")
    for name, info in manifest["files"].items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"{path}: missing {name}")
        if f.stat().st_size != info.get("size"):
            raise CheckpointError(f"{f}: size {f.stat().st_size} differs from the manifest's {info.get('size')} (truncated?)")
        if sha256_file(f) != info.get("sha256"):
            raise CheckpointError(f"{f}: sha256 differs from the manifest (corrupted)")
    return manifest


def load_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, Any]]:
    verify_checkpoint(path)
    model = load_tensors(path / "model.safetensors")
    optim = load_tensors(path / "optim.safetensors")
    try:
        state = json.loads((path / "state.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path / 'state.json'}: invalid JSON ({e})") from None
    return model, optim, state


def latest_valid_checkpoint(run_dir: Path, warn=print) -> Path | None:
    """The newest checkpoint that passes verification; damaged newer ones are reported."""
    for path in reversed(list_checkpoints(run_dir)):
        try:
            verify_checkpoint(path)
            return path
        except CheckpointError as e:
            warn(f"rltok: skipping damaged checkpoint: {e}")
    return None
