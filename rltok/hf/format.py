"""The transformers export's ``config.json``, read without transformers.

An export (``rltok.hf.save_for_transformers``) is a Hugging Face model folder: its ``config.json``
is transformers' (``model_type: rltok``, ``auto_map``, ...) and carries the rltok run config in its
``run_config`` key, the method's own files (a BPE method's ``tokenizer.json``) in
``method_files``; its ``model.safetensors`` holds the U-Net's tensors under ``model.`` (the
attribute of the transformers wrapper that holds the U-Net). ``rltok.from_pretrained`` reads such
a folder through :func:`run_config_of` and :data:`PREFIX`: JSON and safetensors only.

This module imports no transformers, so that rltok can read an export without it; it is also
part of the code an export carries (``rltok.hf.export.bundle_files``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from torch import nn

from ..config import check_stages, run_config_from_dict
from ..errors import RltokError
from ..methods import get_method
from ..schema import FORMAT_VERSION, RunConfig

MODEL_TYPE = "rltok"
EXPORT_FORMAT = "rltok-transformers-v1"  # config.json's "rltok_export"
PREFIX = "model."  # the wrapper's attribute holding the U-Net: tensor names in model.safetensors


def is_export(d: Any) -> bool:
    """Whether a parsed ``config.json`` is a transformers export's (not a run's)."""
    return isinstance(d, dict) and d.get("model_type") == MODEL_TYPE and isinstance(d.get("run_config"), dict)


def run_config_of(d: Any, source: str = "config.json") -> RunConfig:
    """The :class:`RunConfig` of an export's ``run_config`` (with ``rltok_version`` and
    ``format_version``, as a run's config.json has them), checked as ``rltok.run.read_config``
    checks a run's: a newer format is refused, unknown or missing keys are named."""
    if not isinstance(d, dict):
        raise RltokError(f"{source}: run_config must be a JSON object")
    fmt = d.get("format_version", 0)
    if not isinstance(fmt, int) or isinstance(fmt, bool) or fmt < 0:
        raise RltokError(f"{source}: run_config.format_version={fmt!r} must be a non-negative integer")
    if fmt > FORMAT_VERSION:
        raise RltokError(f"{source}: written by rltok {d.get('rltok_version', '?')} in run format {fmt}; "
                         f"this code reads formats up to {FORMAT_VERSION}: upgrade rltok")
    try:
        return check_stages(run_config_from_dict(d, strict=fmt >= 1, format_version=fmt).validate())
    except RltokError as e:
        written = f" (written by rltok {d['rltok_version']})" if "rltok_version" in d else ""
        raise RltokError(f"{source}: run_config: {e}{written}") from None


def method_files_of(d: Any, source: str = "config.json") -> dict[str, str]:
    """The method's files an export carries in its config (name -> text)."""
    files = (d.get("method_files") or {}) if isinstance(d, dict) else {}
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise RltokError(f"{source}: method_files must map file names to their text")
    for name in files:
        if not name or "/" in name or "\\" in name or name.startswith("."):
            raise RltokError(f"{source}: method_files: {name!r} is not a plain file name")
    return dict(files)


def build_model(cfg: RunConfig, files: dict[str, str] | None = None) -> nn.Module:
    """The method's model for ``cfg`` (untrained), built as ``rltok.run.build_model`` builds it
    in a run directory holding ``files`` (the method reads them while it is built)."""
    if get_method(cfg.method).flat:
        raise RltokError(f"method {cfg.method!r} is a flat baseline: the transformers export covers the "
                         f"byte-level U-Net methods")
    if not files:
        return get_method(cfg.method).build(cfg, None)
    with tempfile.TemporaryDirectory(prefix="rltok-method-files-") as tmp:
        for name, text in files.items():
            (Path(tmp) / name).write_text(text, encoding="utf-8")
        return get_method(cfg.method).build(cfg, Path(tmp))
