"""Run directories: what a run holds and how to open one.

    RUN/config.json          the resolved RunConfig (JSON)
    RUN/metrics.jsonl        one JSON object per logged step, evaluation and event
    RUN/model.safetensors    final weights (written atomically at the end of training)
    RUN/summary.json         written last: {"finished": true, final evaluation, throughput, ...}
    RUN/checkpoints/step_*/  resumable checkpoints (see checkpoint.py)
    RUN/<method files>       e.g. tokenizer.json for BPE-guided boundaries
    RUN/.lock                held (flock) by the process that trains the run

A saved model (``rltok.hub.save_pretrained``) opens as a run: the layout above without its
history, or a transformers export (``rltok.hf``: transformers' config.json, whose ``run_config``
key holds the RunConfig and ``method_files`` the method's files, and the U-Net's tensors under
``model.``), read from its JSON and safetensors files only (:func:`read_export`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .checkpoint import latest_valid_checkpoint, load_checkpoint, load_tensors, write_json_atomic
from .config import check_stages, run_config_from_dict
from .errors import RltokError
from .hf.format import PREFIX, build_model as build_exported_model, is_export, method_files_of, run_config_of
from .methods import get_method
from .schema import FORMAT_VERSION, RunConfig
from .metrics import METRICS  # noqa: F401  (part of the run layout)
from .version import __version__

CONFIG = "config.json"
MODEL = "model.safetensors"
SUMMARY = "summary.json"
LOCK = ".lock"
# files of a run that are its history (or the saved model's own files), not the method's
HISTORY = frozenset({CONFIG, MODEL, "metrics.jsonl", SUMMARY, LOCK, "README.md"})


def is_run(path: Path) -> bool:
    return (Path(path) / CONFIG).is_file()


def read_export(run_dir: Path) -> dict | None:
    """The parsed config.json of a transformers export (``rltok.hf``), None for anything else (a
    run, a saved model in the run layout, no readable config)."""
    try:
        d = json.loads((Path(run_dir) / CONFIG).read_text())
    except (OSError, ValueError):
        return None
    return d if is_export(d) else None


def read_config(run_dir: Path) -> RunConfig:
    """The RunConfig of a run, a saved model, or a transformers export (its ``run_config``)."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise RltokError(f"{run_dir}: no such run directory")
    if not is_run(run_dir):
        raise RltokError(f"{run_dir}: not an rltok run (no {CONFIG}); train one with `rltok train --out {run_dir}`")
    try:
        d = json.loads((run_dir / CONFIG).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as e:
        raise RltokError(f"{run_dir / CONFIG}: unreadable run config ({e})") from None
    if not isinstance(d, dict):
        raise RltokError(f"{run_dir / CONFIG}: not a run config")
    if is_export(d):
        return run_config_of(d["run_config"], str(run_dir / CONFIG))
    fmt = d.get("format_version", 0)
    if not isinstance(fmt, int) or isinstance(fmt, bool) or fmt < 0:
        raise RltokError(f"{run_dir / CONFIG}: format_version={fmt!r} must be a non-negative integer")
    if fmt > FORMAT_VERSION:
        raise RltokError(f"{run_dir / CONFIG}: written by rltok {d.get('rltok_version', '?')} in run format "
                         f"{fmt}; this rltok ({__version__}) reads formats up to {FORMAT_VERSION}: upgrade rltok")
    try:
        # format 0: runs from before versions were recorded; their keys are checked leniently
        return check_stages(run_config_from_dict(d, strict=fmt >= 1, format_version=fmt).validate())
    except RltokError as e:
        written = f" (written by rltok {d['rltok_version']})" if "rltok_version" in d else ""
        raise RltokError(f"{run_dir / CONFIG}: {e}{written}") from None


def write_config(run_dir: Path, cfg: RunConfig) -> None:
    write_json_atomic(Path(run_dir) / CONFIG, {**cfg.to_dict(), "rltok_version": __version__,
                                               "format_version": FORMAT_VERSION})


def check_weights(model: nn.Module, tensors: dict[str, torch.Tensor], source: Path | str) -> None:
    """One line naming the first tensor whose name or shape does not fit the model the config
    implies (instead of torch's multi-line size-mismatch report). An older checkpoint's names are
    first renamed in place as the model's ``load_state_dict`` would (``rename_old_keys``)."""
    for name, module in model.named_modules():
        if hasattr(module, "rename_old_keys"):
            module.rename_old_keys(tensors, f"{name}." if name else "")
    want = model.state_dict()
    for name, t in tensors.items():
        if name not in want:
            raise RltokError(f"{source}: tensor {name} is not in the model its config implies "
                             f"({len(want)} tensors expected)")
        if tuple(t.shape) != tuple(want[name].shape):
            raise RltokError(f"{source}: tensor {name} has shape {list(t.shape)} in the file; the config "
                             f"implies {list(want[name].shape)}")
    absent = [n for n in want if n not in tensors]
    if absent:
        raise RltokError(f"{source}: tensor {absent[0]} is missing from the file"
                         f"{f' (and {len(absent) - 1} more)' if len(absent) > 1 else ''}")


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    p = Path(run_dir) / SUMMARY
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text())
    except (json.JSONDecodeError, OSError):
        return None


def is_finished(run_dir: Path) -> bool:
    s = read_summary(run_dir)
    return bool(s and s.get("finished")) and (Path(run_dir) / MODEL).is_file()


class RunLock:
    """An exclusive lock on a run directory while a training process writes it, so that a second
    training of the same run (a requeued job while the old one still runs, workers orphaned by a
    killed torchrun agent) is refused instead of interleaving checkpoints. ``flock`` locks are
    released by the kernel when the holder dies, even by SIGKILL: a lock is never stale.
    Where ``flock`` is unavailable (Windows, some network file systems) training runs unlocked."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.fd: int | None = None

    def acquire(self) -> "RunLock":
        try:
            import fcntl
        except ImportError:  # pragma: no cover
            return self
        path = self.run_dir / LOCK
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise RltokError(f"cannot write {path}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise RltokError(f"{self.run_dir} is being trained by another process (pid {holder}); "
                             f"wait for it to end or stop it first") from None
        except OSError:  # no flock on this file system
            os.close(fd)
            return self
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = None


def build_model(cfg: RunConfig, run_dir: Path | None = None) -> nn.Module:
    return get_method(cfg.method).build(cfg, run_dir)


def method_files(run_dir: Path, text: bool = False) -> dict[str, bytes] | dict[str, str]:
    """The files of a run (or saved model) that its method reads when it is built (a BPE
    method's tokenizer.json), by name: a transformers export carries them in its config.json
    (as text: ``text=True`` decodes them, and refuses a file that is not UTF-8)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RltokError(f"{run_dir}: the model's run directory is gone, and with it the files its method "
                         f"may need (a BPE tokenizer); load the model from where it is now")
    d = read_export(run_dir)
    if d is not None:
        files = method_files_of(d, str(run_dir / CONFIG))
        return files if text else {k: v.encode("utf-8") for k, v in files.items()}
    out = {f.name: f.read_bytes() for f in sorted(run_dir.iterdir())
           if f.is_file() and f.name not in HISTORY and not f.name.startswith(".") and not f.name.endswith(".log")}
    if not text:
        return out
    texts = {}
    for name, data in out.items():
        try:
            texts[name] = data.decode("utf-8")
        except UnicodeDecodeError:
            raise RltokError(f"{run_dir / name}: a transformers export carries method files as text; this one "
                             f"is not UTF-8") from None
    return texts


def load_model(run_dir: str | Path, device: str | torch.device = "cpu", checkpoint: str | None = None) -> nn.Module:
    """The trained model of a run: final weights, or the newest valid checkpoint's if the run
    has not finished; or of a saved model (either layout of ``rltok.hub.save_pretrained``). The
    returned module carries ``.run_config`` and ``.run_dir``. Only JSON and safetensors files
    are read: no code in the directory (a transformers export carries some) is imported."""
    run_dir = Path(run_dir)
    cfg = read_config(run_dir)
    export = read_export(run_dir)
    if export is not None and checkpoint:
        raise RltokError(f"{run_dir}: a transformers export holds one set of weights (no checkpoints); "
                         f"drop --checkpoint")
    if export is not None:  # the method's files are in its config.json
        model = build_exported_model(cfg, method_files_of(export, str(run_dir / CONFIG)))
        tensors, source = _export_tensors(run_dir)
    elif checkpoint:
        model = build_model(cfg, run_dir)
        path = Path(checkpoint)
        if not path.is_absolute() and not path.exists():
            path = run_dir / "checkpoints" / checkpoint

        tensors = load_checkpoint(path)[0]
        source = path
    elif (run_dir / MODEL).is_file():
        model = build_model(cfg, run_dir)
        source = run_dir / MODEL
        tensors = load_tensors(source)
    else:
        model = build_model(cfg, run_dir)
        ck = latest_valid_checkpoint(run_dir)
        if ck is None:
            raise RltokError(f"{run_dir}: the run has no weights yet (no {MODEL} and no valid checkpoint)")
        source = ck / "model.safetensors"
        tensors = load_tensors(source)
    check_weights(model, tensors, source)
    model.load_state_dict(tensors)
    model.run_config = cfg
    model.run_dir = run_dir
    model.weights = weights_used(run_dir, Path(source))
    return model.to(device).eval()


def _export_tensors(path: Path) -> tuple[dict[str, torch.Tensor], Path]:
    """A transformers export's tensors with rltok's names (the wrapper's ``model.`` prefix
    dropped), from model.safetensors or the shards its index names; and the (first) file."""
    index = path / "model.safetensors.index.json"
    if index.is_file():  # transformers shards large models
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError, TypeError) as e:
            raise RltokError(f"{index}: unreadable shard index ({e})") from None
        bad = [s for s in shards if not isinstance(s, str) or Path(s).name != s or not s.endswith(".safetensors")]
        if not shards:
            raise RltokError(f"{index}: names no safetensors file")
        if bad:
            raise RltokError(f"{index}: {bad[0]!r} is not a safetensors file of this folder")
        sources = [path / s for s in shards]
    else:
        sources = [path / MODEL]
    tensors = {}
    for src in sources:
        if not src.is_file():
            raise RltokError(f"{src}: missing (a transformers export has its weights in safetensors files)")
        for k, v in load_tensors(src).items():
            if not k.startswith(PREFIX):
                raise RltokError(f"{src}: tensor {k} is not the wrapped U-Net's ({PREFIX}...)")
            tensors[k[len(PREFIX):]] = v
    return tensors, sources[0]


def weights_used(run_dir: Path, source: Path) -> dict[str, Any]:
    """What every output names: the weights file used, relative to the run where it lies inside
    it (``model.safetensors`` or ``checkpoints/step_00000078``), the optimizer step it holds, and
    whether the run finished (a run stopped early is evaluated on its newest checkpoint)."""
    source = Path(source)
    where = source.parent if source.name == MODEL and source.parent.name.startswith("step_") else source
    try:
        name = str(where.resolve().relative_to(Path(run_dir).resolve()))
    except ValueError:
        name = str(where)
    step = None
    if where.name.startswith("step_") and where.name[5:].isdigit():
        step = int(where.name[5:])
    else:
        s = read_summary(run_dir)
        if s and isinstance(s.get("steps"), int):
            step = s["steps"]
    return {"checkpoint": name, "step": step, "finished": is_finished(run_dir)}


def describe_weights(model: nn.Module) -> str:
    """One line: ``checkpoints/step_00000078 (step 78; the run has not finished)``."""
    w = getattr(model, "weights", None)
    if not w:
        return "weights given in memory"
    step = f"step {w['step']}; " if w.get("step") is not None else ""
    return f"{w['checkpoint']} ({step}{'finished run' if w['finished'] else 'the run has not finished'})"
