"""The transformers side of rltok.hf: the wrapper around a model, saving it as an export, the Auto classes.

``save_for_transformers(model, DIR)`` writes the export (``rltok.hf.bundle``: transformers' config,
weights and tokenizer config, and rltok's own modeling code as flat files) with a model card and
the run's final evaluation: what ``rltok.hub.save_pretrained`` writes by default, with the
wrapper's ``boundary_mode`` and method files when given an :class:`RltokForCausalLM`. How the code
is bundled, and why it stays in sync with rltok: ``rltok.hf.bundle``.
"""

from __future__ import annotations

import inspect
from pathlib import Path

from torch import nn

from ..run import method_files  # up a layer: hf/ holds the format run.py reads; this writer sits above both
from .bundle import AUTO_MAP, GLUE, bundle_files, check_exportable, flat_name, run_config_dict, write_code
from .configuration_rltok import RltokConfig
from .modeling_rltok import RltokForCausalLM
from .tokenization_rltok import RltokByteTokenizer


def to_transformers(model: nn.Module, boundary_mode: str = "greedy") -> RltokForCausalLM:
    """``model`` (an rltok U-Net with its run config) inside an :class:`RltokForCausalLM`: the same
    module and parameters, not a copy."""
    check_exportable(model)
    run_dir = getattr(model, "run_dir", None)
    files = method_files(Path(run_dir), text=True) if run_dir is not None else {}
    config = RltokConfig(run_config=run_config_dict(model), method_files=files,
                         boundary_mode=boundary_mode)
    config.architectures = ["RltokForCausalLM"]
    config.auto_map = dict(AUTO_MAP)
    dtype = next(model.parameters()).dtype
    config.dtype = dtype
    hf = RltokForCausalLM(config, model=model)
    return hf.to(dtype).train(model.training)


def save_for_transformers(model: nn.Module, save_directory: str | Path, *, boundary_mode: str | None = None,
                          repo_id: str | None = None) -> Path:
    """Write ``model`` (an rltok U-Net with its run config, or an :class:`RltokForCausalLM`) as a
    transformers folder that ``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)``
    loads without rltok, and ``rltok.from_pretrained(DIR)`` / ``rltok.load(DIR)`` load without
    running any of its code: ``rltok.hub.save_pretrained(model, DIR, transformers=True)``.
    ``boundary_mode`` (greedy by default; an :class:`RltokForCausalLM`'s own by default) goes
    into the config. Of an :class:`RltokForCausalLM`'s config only ``boundary_mode`` and
    ``method_files`` are kept (its ``save_pretrained`` writes the whole config, and the code)."""
    from ..hub import _save  # up a layer, at call time: an export is written through the hub

    files = None
    if isinstance(model, RltokForCausalLM):
        boundary_mode = boundary_mode or model.config.boundary_mode
        if getattr(model.model, "run_dir", None) is None:
            files = dict(model.config.method_files)
        model = model.model
    return _save(model, save_directory, repo_id, transformers=True, boundary_mode=boundary_mode or "greedy",
                 files=files)


def register() -> None:
    """Make transformers' Auto classes know rltok's classes (with rltok installed): an export then
    loads with ``trust_remote_code=False`` too, and runs this rltok's code, not the folder's."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    AutoConfig.register("rltok", RltokConfig, exist_ok=True)
    AutoModelForCausalLM.register(RltokConfig, RltokForCausalLM, exist_ok=True)
    if "tokenizer_class" in inspect.signature(AutoTokenizer.register).parameters:
        AutoTokenizer.register(RltokConfig, tokenizer_class=RltokByteTokenizer, exist_ok=True)
    else:  # transformers 4
        AutoTokenizer.register(RltokConfig, slow_tokenizer_class=RltokByteTokenizer, exist_ok=True)


__all__ = ["AUTO_MAP", "GLUE", "bundle_files", "flat_name", "register", "save_for_transformers", "to_transformers",
           "write_code", "RltokConfig", "RltokForCausalLM", "RltokByteTokenizer"]
