"""Writing a transformers model folder from an rltok model, and the code it carries.

``save_for_transformers(model, DIR)`` writes::

    DIR/config.json                 transformers' config: model_type rltok, auto_map, architectures,
                                    run_config (the rltok run config), method_files, boundary_mode
    DIR/generation_config.json      bos/eos 256, pad 257
    DIR/model.safetensors           the U-Net's tensors, named model.<rltok name>
    DIR/tokenizer_config.json       the byte tokenizer (auto_map AutoTokenizer)
    DIR/configuration_rltok.py      RltokConfig                  } rltok/hf/*.py of this rltok, and
    DIR/modeling_rltok.py           RltokForCausalLM             } the rltok modules they import,
    DIR/tokenization_rltok.py       RltokByteTokenizer           } as flat files rltok_<module>.py
    DIR/rltok_*.py                  e.g. rltok_model_unet.py     } (:func:`bundle_files`)
    DIR/README.md                   a model card
    DIR/summary.json                the run's final evaluation (only with a finished run's final weights)

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
"""

from __future__ import annotations

import ast
import inspect
import json
import re
from pathlib import Path

from torch import nn

from ..errors import RltokError
from ..version import __version__
from .configuration_rltok import RltokConfig
from .modeling_rltok import RltokForCausalLM
from .tokenization_rltok import RltokByteTokenizer

GLUE = ("rltok.hf.configuration_rltok", "rltok.hf.modeling_rltok", "rltok.hf.tokenization_rltok")
AUTO_MAP = {"AutoConfig": "configuration_rltok.RltokConfig",
            "AutoModelForCausalLM": "modeling_rltok.RltokForCausalLM",
            "AutoTokenizer": ["tokenization_rltok.RltokByteTokenizer", None]}
_ROOT = Path(__file__).resolve().parents[1]  # the rltok package directory
_FOOTER = "by rltok.hf.export"  # in every file of the bundle
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


# -- the wrapper, the folder, the Auto classes ---------------------------------------------------------

def _run_config_dict(model: nn.Module) -> dict:
    from ..schema import FORMAT_VERSION

    cfg = getattr(model, "run_config", None)
    if cfg is None:
        raise RltokError("the transformers export needs a model with its run config (one from rltok.load, "
                         "rltok.from_pretrained or training; or set model.run_config)")
    return {**cfg.to_dict(), "rltok_version": __version__, "format_version": FORMAT_VERSION}


def _method_files(model: nn.Module) -> dict[str, str]:
    """The files of the model's run directory that the method reads when it is built (a BPE
    method's tokenizer.json), as text."""
    run_dir = getattr(model, "run_dir", None)
    if run_dir is None:
        return {}
    from ..hub import _HISTORY

    if not Path(run_dir).is_dir():
        raise RltokError(f"{run_dir}: the model's run directory is gone, and with it the files its method "
                         f"may need (a BPE tokenizer); load the model from where it is now")
    out = {}
    for f in sorted(Path(run_dir).iterdir()):
        if f.is_file() and f.name not in _HISTORY and not f.name.startswith(".") and not f.name.endswith(".log"):
            try:
                out[f.name] = f.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise RltokError(f"{f}: the transformers export carries method files as text; this one is "
                                 f"not UTF-8") from None
    return out


def to_transformers(model: nn.Module, boundary_mode: str = "greedy") -> RltokForCausalLM:
    """``model`` (an rltok U-Net with its run config) inside an :class:`RltokForCausalLM`: the same
    module and parameters, not a copy."""
    if not callable(getattr(model, "prefill", None)):
        raise RltokError(f"{type(model).__name__}: a flat baseline; the transformers export covers rltok's "
                         f"byte-level U-Nets (the boundary methods)")
    config = RltokConfig(run_config=_run_config_dict(model), method_files=_method_files(model),
                         boundary_mode=boundary_mode)
    config.architectures = ["RltokForCausalLM"]
    config.auto_map = dict(AUTO_MAP)
    dtype = next(model.parameters()).dtype
    config.dtype = dtype
    hf = RltokForCausalLM(config, model=model)
    return hf.to(dtype).train(model.training)


def save_for_transformers(model: nn.Module, save_directory: str | Path, *, boundary_mode: str = "greedy",
                          repo_id: str | None = None) -> Path:
    """Write ``model`` (an rltok U-Net with its run config, or an :class:`RltokForCausalLM`) as a
    transformers folder (module docstring) that ``AutoModelForCausalLM.from_pretrained(DIR,
    trust_remote_code=True)`` loads without rltok, and ``rltok.from_pretrained(DIR)`` loads
    without running any of its code."""
    from ..checkpoint import write_json_atomic
    from ..hub import final_summary

    hf = model if isinstance(model, RltokForCausalLM) else to_transformers(model, boundary_mode)
    net = hf.model
    out = Path(save_directory)
    run_dir = getattr(net, "run_dir", None)
    if run_dir is not None and out.resolve() == Path(run_dir).resolve():
        raise RltokError(f"{out}: is the model's own run directory; save to another directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RltokError(f"cannot create {out}: {e.strerror or e}") from None
    bundle_files()  # fails before anything is written if the code cannot be bundled
    hf.config.auto_map = dict(AUTO_MAP)
    hf.config.architectures = ["RltokForCausalLM"]
    hf.save_pretrained(out)  # config, generation config, weights, and (write_code) the code
    RltokByteTokenizer().save_pretrained(out)
    summary = final_summary(net) if getattr(net, "run_config", None) is not None else None
    if summary:
        write_json_atomic(out / "summary.json", summary)
    else:
        (out / "summary.json").unlink(missing_ok=True)
    _card(net, summary, repo_id or str(out)).save(out / "README.md")
    return out


def write_code(save_directory: str | Path) -> None:
    """Put the code files (:func:`bundle_files`) into a folder that transformers' ``save_pretrained``
    wrote for rltok's :class:`RltokForCausalLM`, and ``auto_map`` into its config.json."""
    from ..checkpoint import write_json_atomic

    out = Path(save_directory)
    files = bundle_files()
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
    for old in out.glob("rltok_*.py"):  # modules an earlier export carried and this rltok no longer has
        if old.name not in files and _FOOTER in old.read_text(encoding="utf-8", errors="replace"):
            old.unlink()
    d = json.loads((out / "config.json").read_text())
    if d.get("auto_map") != AUTO_MAP or d.get("architectures") != ["RltokForCausalLM"]:
        write_json_atomic(out / "config.json", {**d, "auto_map": AUTO_MAP, "architectures": ["RltokForCausalLM"]})


def _card(model: nn.Module, summary: dict | None, name: str):
    """rltok's model card, with transformers' metadata and how to load the folder both ways."""
    from huggingface_hub import ModelCard

    from ..hub import model_card

    text = str(model_card(model, summary, name).content)
    text = text.replace("library_name: rltok", "library_name: transformers", 1)
    text = text.replace("- rltok\n", "- rltok\n- custom_code\n", 1)
    head = text.split("\n## Use\n", 1)[0].rstrip("\n")
    return ModelCard(head + f"""

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
""")


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


__all__ = ["AUTO_MAP", "bundle_files", "flat_name", "register", "save_for_transformers", "to_transformers", "write_code",
           "RltokConfig", "RltokForCausalLM", "RltokByteTokenizer"]
