"""Checkpoints: safetensors for tensors, JSON for everything else; never pickle.

A checkpoint is a directory ``RUN/checkpoints/step_XXXXXXXX/`` holding ``model.safetensors``,
``optim.safetensors`` (AdamW moments), ``state.json`` (step, bytes seen, schedule, RNG state as
numbers, optimizer hyper-parameters) and ``manifest.json`` (size and sha256 of each file).

Writing is atomic: files go to a temporary directory, each is fsynced, the manifest is written
last, and the directory is renamed into place (then the parent is fsynced). A reader therefore
sees either a complete checkpoint or none; a damaged one (truncated, corrupted, edited) fails its
manifest check and is reported, and resuming falls back to the newest valid one.

Test hook (inert unless set): ``RLTOK_FAULT_SLEEP_IN_CHECKPOINT=SECONDS`` makes a checkpoint write
pause twice, after ``model.safetensors`` and before the final rename, announcing each pause on
stderr (``rltok-fault: ...``), so that tests can kill the process inside the write.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
import time
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


REQUIRED_FILES = ("model.safetensors", "optim.safetensors", "state.json")
FAULT_SLEEP_ENV = "RLTOK_FAULT_SLEEP_IN_CHECKPOINT"


def _fault_pause(where: str) -> None:
    """Test hook: pause inside a checkpoint write (see the module docstring)."""
    seconds = os.environ.get(FAULT_SLEEP_ENV)
    if seconds:
        print(f"rltok-fault: pausing {seconds}s {where}", file=sys.stderr, flush=True)
        time.sleep(float(seconds))


def _cause(e: BaseException) -> str:
    """One line saying why a write failed (safetensors reports I/O errors as SafetensorError)."""
    return getattr(e, "strerror", None) or (str(e).splitlines() or [type(e).__name__])[0][:200]


WRITE_ERRORS = (OSError, SafetensorError)


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
    """Write to a temporary name, fsync, rename. On failure (disk full, read-only) the old file
    is untouched and an RltokError names the path."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        _unlink_quietly(tmp)
        if isinstance(e, OSError):
            raise RltokError(f"cannot write {path}: {_cause(e)}") from None
        raise
    _fsync_dir(path.parent)


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def finite_or_null(obj: Any) -> Any:
    """obj with every NaN or infinite float replaced by None, so json.dumps(..., allow_nan=False)
    writes strict JSON: NaN is not JSON (RFC 8259) and jq, JavaScript and most loaders other than
    Python's reject it; a published record says "no value" (a byte model's rate) as null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_null(v) for v in obj]
    return obj


def write_json_atomic(path: Path, obj: Any) -> None:
    write_bytes_atomic(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def save_tensors_atomic(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        save_file(_contiguous(tensors), str(tmp), metadata=metadata)
        _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        _unlink_quietly(tmp)
        if isinstance(e, WRITE_ERRORS):
            raise RltokError(f"cannot write {path}: {_cause(e)}") from None
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
        _fault_pause(f"in checkpoint {final.name} after model.safetensors")
        save_file(_contiguous(optim_tensors), str(tmp / "optim.safetensors"), metadata={"format": FORMAT})
        with open(tmp / "state.json", "w") as f:
            json.dump({**state, "optimizer": optim_meta}, f, indent=2, sort_keys=True)
        files = {}
        for name in REQUIRED_FILES:
            _fsync_file(tmp / name)
            files[name] = {"size": (tmp / name).stat().st_size, "sha256": sha256_file(tmp / name)}
        manifest = {"format": FORMAT, "step": step, "files": files}
        with open(tmp / "manifest.json", "w") as f:
            json.dump(manifest, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        _fault_pause(f"in checkpoint {final.name} before the rename")
        if final.exists():  # re-saving the same step: move the old one aside first
            _remove_dir(final)
        os.replace(tmp, final)
        _fsync_dir(root)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, WRITE_ERRORS):
            raise CheckpointError(f"cannot write checkpoint to {final}: {_cause(e)}; "
                                  f"earlier checkpoints are intact") from None
        raise
    for old in list_checkpoints(run_dir)[:-keep]:
        _remove_dir(old)
    return final


def _remove_dir(path: Path) -> None:
    """Rename aside, then delete: a kill in the middle leaves a hidden directory (removed later
    by remove_stale_temporaries), never a half-deleted checkpoint."""
    trash = path.with_name(f".old-{path.name}-{os.getpid()}")
    try:
        os.replace(path, trash)
    except OSError:
        trash = path
    shutil.rmtree(trash, ignore_errors=True)


def remove_stale_temporaries(run_dir: Path) -> list[Path]:
    """Remove what a killed writer leaves behind: temporary checkpoint directories and
    temporary files of atomic writes. Call only while no other process writes this run."""
    run_dir = Path(run_dir)
    stale = [p for p in checkpoint_dir(run_dir).glob(".tmp-step_*")] + \
        [p for p in checkpoint_dir(run_dir).glob(".old-step_*")] + \
        [p for p in run_dir.glob(".*.tmp-*") if p.is_file()]
    for p in stale:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            _unlink_quietly(p)
    return stale


def verify_checkpoint(path: Path) -> dict[str, Any]:
    """Check the manifest (presence, sizes, sha256). Returns it; raises CheckpointError."""
    man_path = path / "manifest.json"
    try:
        manifest = json.loads(man_path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: incomplete checkpoint (no manifest.json)") from None
    except (ValueError, RecursionError, OSError):
        raise CheckpointError(f"{man_path}: unreadable manifest") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if (not isinstance(files, dict) or manifest.get("format") != FORMAT
            or not all(isinstance(i, dict) for i in files.values())):
        raise CheckpointError(f"{man_path}: not an rltok checkpoint manifest")
    for name in REQUIRED_FILES:
        if name not in files:
            raise CheckpointError(f"{man_path}: does not list {name}")
    for name, info in files.items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"{path}: missing {name}")
        if f.stat().st_size != info.get("size"):
            raise CheckpointError(f"{f}: size {f.stat().st_size} differs from the manifest's {info.get('size')} (truncated?)")
        if sha256_file(f) != info.get("sha256"):
            raise CheckpointError(f"{f}: sha256 differs from the manifest (corrupted)")
    return manifest


def load_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, Any]]:
    """Verify and read a checkpoint: tensors through safetensors, the rest through JSON. A file
    that is not what it should be (a pickle, a truncated file, JSON of the wrong shape) raises
    CheckpointError; nothing in it is ever executed."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    verify_checkpoint(path)
    model = load_tensors(path / "model.safetensors")
    optim = load_tensors(path / "optim.safetensors")
    try:
        state = json.loads((path / "state.json").read_text())
    except (ValueError, RecursionError) as e:
        raise CheckpointError(f"{path / 'state.json'}: invalid JSON ({str(e)[:200]})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path / 'state.json'}: not a JSON object")
    for key in ("step", "bytes_seen"):
        if not isinstance(state.get(key), int) or isinstance(state.get(key), bool) or state[key] < 0:
            raise CheckpointError(f"{path / 'state.json'}: {key!r} must be a non-negative integer")
    seconds = state.get("train_seconds", 0.0)  # absent in checkpoints written before it was saved
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < float("inf"):
        raise CheckpointError(f"{path / 'state.json'}: 'train_seconds' must be a non-negative number")
    if not isinstance(state.get("optimizer"), dict):
        raise CheckpointError(f"{path / 'state.json'}: no optimizer state")
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


def load_latest_checkpoint(run_dir: Path, warn=print):
    """The newest checkpoint that verifies *and* loads, as ``(path, model, optim, state)``;
    None if there is none. Each damaged newer one is reported through ``warn`` and skipped."""
    for path in reversed(list_checkpoints(run_dir)):
        try:
            return (path, *load_checkpoint(path))
        except CheckpointError as e:
            warn(f"rltok: skipping damaged checkpoint: {e}")
    return None
