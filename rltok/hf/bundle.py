"""A transformers export, written without transformers: the code it carries and its files.

``write_export(model, DIR)`` writes (``rltok.hub.save_pretrained`` adds README.md and summary.json)::

    DIR/config.json                 transformers' config: model_type rltok, auto_map, architectures,
                                    run_config (the rltok run config), method_files, boundary_mode
    DIR/generation_config.json      bos/eos 256, pad 257
    DIR/model.safetensors           the U-Net's tensors, named model.<rltok name>
    DIR/tokenizer_config.json       the byte tokenizer (auto_map AutoTokenizer)
    DIR/configuration_rltok.py      RltokConfig                  } rltok/hf/*.py of this rltok, and
    DIR/modeling_rltok.py           RltokForCausalLM             } the rltok modules they import,
    DIR/tokenization_rltok.py       RltokByteTokenizer           } as flat files rltok_<module>.py
    DIR/rltok_*.py                  e.g. rltok_model_unet.py     } (:func:`bundle_files`)

These JSON files are what transformers' own ``save_pretrained`` writes for
:class:`~rltok.hf.RltokForCausalLM` and :class:`~rltok.hf.RltokByteTokenizer` (less
``transformers_version``; ``tests/test_hf.py`` compares them), written here from the run config so
that saving a model needs no transformers (``rltok.hub.save_pretrained`` writes this layout by
default). The weights are one safetensors file (metadata ``format: pt``, as transformers reads it).

Where the remote code comes from, and why it stays in sync: nothing is maintained twice. The
modeling code *is* rltok's code: :func:`bundle_files` reads the source files of the rltok that
writes the export (starting from the three ``rltok/hf`` modules, following their relative imports
through ``rltok.generate``, ``rltok.model.*``, ``rltok.boundaries.*``, ...), and rewrites only
their relative imports, because transformers copies remote code as files of one flat folder and
follows ``from .name import`` lines only (``transformers.dynamic_module_utils``:
``get_relative_imports`` / ``get_relative_import_files``): ``from ..model.unet import ByteUNet``
in ``rltok/boundaries/policy.py`` becomes ``from .rltok_model_unet import ByteUNet``, ``from ..
import estimator as est`` becomes ``from . import rltok_estimator as est``. Every rewritten
statement stays on its line (tracebacks name the same lines as rltok's sources), and a footer
names the file it came from. ``modeling_rltok.py`` ends with one ``from .rltok_x import
__name__`` line per module, so that transformers copies every file (local folders) and downloads
every file (the Hub) with it. So an export runs exactly the code of the rltok version that wrote
its weights, whatever rltok (if any) is installed where it is loaded; the bundle needs only
torch, numpy, safetensors and tokenizers, which transformers itself requires.

This module imports no transformers (nor ``rltok.hub``, which calls it).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from torch import nn

from ..checkpoint import save_tensors_atomic, write_json_atomic
from ..errors import RltokError
from ..schema import BOS, FORMAT_VERSION, N_INPUT_IDS, PAD
from ..version import __version__
from .format import EXPORT_FORMAT, MODEL_TYPE, PREFIX

GLUE = ("rltok.hf.configuration_rltok", "rltok.hf.modeling_rltok", "rltok.hf.tokenization_rltok")
AUTO_MAP = {"AutoConfig": "configuration_rltok.RltokConfig",
            "AutoModelForCausalLM": "modeling_rltok.RltokForCausalLM",
            "AutoTokenizer": ["tokenization_rltok.RltokByteTokenizer", None]}
_ROOT = Path(__file__).resolve().parents[1]  # the rltok package directory
_FOOTER = "by rltok.hf.export"  # in every file of the bundle (as earlier exports have it: keep)
# the two patterns transformers' get_relative_imports looks for
_TRANSFORMERS_RELATIVE = (re.compile(r"^\s*import\s+\.(\S+)\s*$", re.MULTILINE),
                          re.compile(r"^\s*from\s+\.(\S+)\s+import", re.MULTILINE))


# -- the bundle: rltok's own modules as flat files -----------------------------------------------------

def flat_name(module: str) -> str:
    """``rltok.model.unet`` -> ``rltok_model_unet``; the three rltok.hf modules keep their names
    (``modeling_rltok``, as transformers' conventions have them)."""
    if module in GLUE:
        return module.rsplit(".", 1)[1]
    return module.replace(".", "_")


def _source_file(module: str) -> tuple[Path, bool] | None:
    """(file, is_package) of an rltok module, None when there is no such module."""
    parts = module.split(".")
    if parts[0] != "rltok":
        return None
    base = _ROOT.joinpath(*parts[1:])
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py"), False
    if (base / "__init__.py").is_file():
        return base / "__init__.py", True
    return None


def _rewrite(module: str, text: str, is_pkg: bool) -> tuple[str, set[str]]:
    """``text`` with its relative imports pointing at flat names; the rltok modules it imports."""
    tree = ast.parse(text)
    pkg = module.split(".") if is_pkg else module.split(".")[:-1]
    edits, deps = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "rltok" for a in node.names) or (
                isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "rltok"):
            raise RltokError(f"{module} line {node.lineno}: imports rltok by its absolute name; the transformers "
                             f"export needs relative imports")
        if not (isinstance(node, ast.ImportFrom) and node.level):
            continue
        if node.level - 1 >= len(pkg):
            raise RltokError(f"{module} line {node.lineno}: relative import beyond the rltok package")
        target = ".".join(pkg[: len(pkg) - (node.level - 1)] + ([node.module] if node.module else []))
        stmts, attrs = [], []
        for a in node.names:
            sub = f"{target}.{a.name}"
            if a.name != "*" and _source_file(sub) is not None:  # a submodule: import it as a module
                stmts.append(f"from . import {flat_name(sub)} as {a.asname or a.name}")
                deps.add(sub)
            else:
                attrs.append(a)
        if attrs:
            if _source_file(target) is None:
                raise RltokError(f"{module} line {node.lineno}: {target} is not an rltok module")
            names = ", ".join(f"{a.name} as {a.asname}" if a.asname else a.name for a in attrs)
            stmts.insert(0, f"from .{flat_name(target)} import {names}")
            deps.add(target)
        edits.append((node.lineno, node.col_offset, node.end_lineno, node.end_col_offset, "; ".join(stmts)))
    lines = text.encode("utf-8").splitlines(keepends=True)
    for l1, c1, l2, c2, new in sorted(edits, reverse=True):
        head, tail = lines[l1 - 1][:c1], lines[l2 - 1][c2:]
        # the statement stays on its first line; the lines it spanned stay, empty
        lines[l1 - 1: l2] = [head + new.encode("utf-8") + tail] + [b"\n"] * (l2 - l1)
    return b"".join(lines).decode("utf-8"), deps


def bundle_files() -> dict[str, str]:
    """File name -> text of the code an export carries: the three rltok.hf modules and every rltok
    module they import (transitively), with flat relative imports (module docstring)."""
    todo, done = list(GLUE), {}
    sources: dict[str, Path] = {}
    while todo:
        mod = todo.pop()
        if mod in done:
            continue
        found = _source_file(mod)
        if found is None:
            raise RltokError(f"{mod}: no source file in {_ROOT}")
        path, is_pkg = found
        text, deps = _rewrite(mod, path.read_text(encoding="utf-8"), is_pkg)
        done[mod], sources[mod] = text, path
        todo += sorted(d for d in deps if d not in done)
    names = {flat_name(m): m for m in done}
    if len(names) != len(done):
        raise RltokError("two rltok modules flatten to the same file name")
    files = {}
    for mod, text in done.items():
        rel = sources[mod].relative_to(_ROOT.parent).as_posix()
        text = text.rstrip("\n") + (f"\n\n\n# Copied from {rel} of rltok {__version__} {_FOOTER}: its "
                                    f"relative imports\n# point at this folder's flat copies. Do not edit: "
                                    f"export again.\n")
        if mod == "rltok.hf.modeling_rltok":
            text += ("\n# Every rltok module this folder carries, so that transformers copies (or downloads) "
                     "each file\n# with this one: it follows `from .name import` lines.\n")
            text += "".join(f"from .{n} import __name__ as _  # noqa: E402,F401\n"
                            for n in sorted(names) if n != "modeling_rltok")
            text += "del _\n"
        files[flat_name(mod) + ".py"] = text
    for name, text in files.items():  # what transformers will look for must all be here
        for pattern in _TRANSFORMERS_RELATIVE:
            for ref in pattern.findall(text):
                if f"{ref}.py" not in files:
                    raise RltokError(f"{name}: transformers would look for {ref}.py, which the export lacks "
                                     f"(a line starting `from .{ref} import` in a docstring?)")
    return files


# -- the folder's files ----------------------------------------------------------------------------------

BOS_TOKEN, PAD_TOKEN = "<|bos|>", "<|pad|>"  # as rltok.hf.tokenization_rltok names them
_EXPORT_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer_config.json")


def is_exportable(model: nn.Module) -> bool:
    """Whether ``model`` is one of rltok's byte-level U-Nets (the boundary methods), which the
    export covers; the flat baselines (bytes, bpe-lm) are not."""
    return callable(getattr(model, "prefill", None))


def check_exportable(model: nn.Module) -> None:
    if not is_exportable(model):
        raise RltokError(f"{type(model).__name__}: a flat baseline; the transformers export covers rltok's "
                         f"byte-level U-Nets (the boundary methods)")


def run_config_dict(model: nn.Module) -> dict:
    """The model's run config as a run's config.json holds it (with rltok_version, format_version)."""
    cfg = getattr(model, "run_config", None)
    if cfg is None:
        raise RltokError("the transformers export needs a model with its run config (one from rltok.load, "
                         "rltok.from_pretrained or training; or set model.run_config)")
    return {**cfg.to_dict(), "rltok_version": __version__, "format_version": FORMAT_VERSION}


def config_dict(model: nn.Module, files: dict[str, str], boundary_mode: str = "greedy") -> dict:
    """The export's config.json: what ``RltokConfig(run_config=..., method_files=files,
    boundary_mode=...)`` with ``architectures`` and ``auto_map`` saves (its derived attributes
    as ``rltok.hf.configuration_rltok`` derives them). ``files``: the method's files, as text
    (``rltok.run.method_files(run_dir, text=True)``)."""
    if boundary_mode not in ("greedy", "sample"):
        raise RltokError(f"boundary_mode={boundary_mode!r} must be greedy or sample")
    rc = run_config_dict(model)
    shape = rc.get("model") or {}
    seq_len = shape.get("seq_len")
    d = {"architectures": ["RltokForCausalLM"], "auto_map": dict(AUTO_MAP), "bos_token_id": BOS,
         "boundary_mode": boundary_mode, "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
         "eos_token_id": BOS, "hidden_size": shape.get("d_model"),
         "max_position_embeddings": seq_len - 1 if isinstance(seq_len, int) else None,
         "method_files": dict(files), "model_type": MODEL_TYPE,
         "num_attention_heads": shape.get("n_heads"),
         "num_hidden_layers": sum(int(shape.get(k) or 0) for k in ("enc_layers", "main_layers", "dec_layers")),
         "pad_token_id": PAD, "rltok_export": EXPORT_FORMAT, "run_config": rc, "tie_word_embeddings": False,
         "vocab_size": N_INPUT_IDS}
    return d


def tokenizer_config() -> dict:
    """What ``RltokByteTokenizer().save_pretrained`` writes to tokenizer_config.json."""
    special = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
    return {"added_tokens_decoder": {str(BOS): {"content": BOS_TOKEN, **special},
                                     str(PAD): {"content": PAD_TOKEN, **special}},
            "auto_map": {"AutoTokenizer": list(AUTO_MAP["AutoTokenizer"])}, "backend": "custom",
            "bos_token": BOS_TOKEN, "clean_up_tokenization_spaces": False, "eos_token": BOS_TOKEN,
            "pad_token": PAD_TOKEN, "split_special_tokens": True, "tokenizer_class": "RltokByteTokenizer"}


def write_export(model: nn.Module, out: Path, files: dict[str, str], *, boundary_mode: str = "greedy",
                 metadata: dict[str, str] | None = None) -> None:
    """Write the export's config, generation config, tokenizer config, weights and code (module
    docstring) into the existing folder ``out``. ``files``: the method's files, as text. What can
    fail (no run config, a flat baseline, code that cannot be bundled) fails before anything is
    written."""
    check_exportable(model)
    config = config_dict(model, files, boundary_mode)
    code = bundle_files()
    out = Path(out)
    for name, text in code.items():
        (out / name).write_text(text, encoding="utf-8")
    _remove_stale_code(out, code)
    save_tensors_atomic(out / "model.safetensors", {PREFIX + k: v for k, v in model.state_dict().items()},
                        metadata={"format": "pt", "rltok_export": EXPORT_FORMAT, **(metadata or {})})
    write_json_atomic(out / "generation_config.json", {"bos_token_id": BOS, "eos_token_id": BOS,
                                                       "pad_token_id": PAD})
    write_json_atomic(out / "tokenizer_config.json", tokenizer_config())
    (out / "model.safetensors.index.json").unlink(missing_ok=True)  # a sharded save's, naming other files
    write_json_atomic(out / "config.json", config)  # last: the folder is an export once this is written


def is_bundled_file(path: Path) -> bool:
    """Whether ``path`` is a code file an export carries (:func:`bundle_files` wrote it)."""
    try:
        return path.suffix == ".py" and _FOOTER in path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def _remove_stale_code(out: Path, files: dict[str, str]) -> None:
    for old in out.glob("rltok_*.py"):  # modules an earlier export carried and this rltok no longer has
        if old.name not in files and is_bundled_file(old):
            old.unlink()


def write_code(save_directory: str | Path) -> None:
    """Put the code files (:func:`bundle_files`) into a folder that transformers' ``save_pretrained``
    wrote for rltok's :class:`RltokForCausalLM`, and ``auto_map`` into its config.json."""
    out = Path(save_directory)
    files = bundle_files()
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
    _remove_stale_code(out, files)
    d = json.loads((out / "config.json").read_text())
    if d.get("auto_map") != AUTO_MAP or d.get("architectures") != ["RltokForCausalLM"]:
        write_json_atomic(out / "config.json", {**d, "auto_map": AUTO_MAP, "architectures": ["RltokForCausalLM"]})


__all__ = ["AUTO_MAP", "GLUE", "bundle_files", "check_exportable", "config_dict", "flat_name", "is_bundled_file",
           "is_exportable", "run_config_dict", "tokenizer_config", "write_code", "write_export"]
