"""rltok models inside Hugging Face transformers (``pip install 'rltok[hf]'``).

    >>> import rltok, rltok.hf
    >>> model = rltok.load("runs/tiny")
    >>> rltok.hf.save_for_transformers(model, "export/tiny-rl")   # or push_to_hub(..., transformers=True)

    >>> from transformers import AutoModelForCausalLM, AutoTokenizer   # rltok need not be installed
    >>> lm = AutoModelForCausalLM.from_pretrained("export/tiny-rl", trust_remote_code=True)
    >>> tok = AutoTokenizer.from_pretrained("export/tiny-rl", trust_remote_code=True)
    >>> ids = tok("The city council", return_tensors="pt").input_ids
    >>> lm.generate(ids, max_new_tokens=64, do_sample=True, temperature=0.8, seed=0)  # rltok's cached decoding
    >>> rltok.hf.register()   # with rltok installed: the Auto classes use its classes, no remote code

* :class:`RltokConfig` (``configuration_rltok``): the run config, carried whole;
* :class:`RltokForCausalLM` (``modeling_rltok``): a ``PreTrainedModel`` + ``GenerationMixin`` over
  the U-Net itself (attribute ``model``: the same module and weights, no copy);
* :class:`RltokByteTokenizer` (``tokenization_rltok``): bytes as ids, rltok's BOS and PAD;
* :func:`save_for_transformers` writes a folder that ``AutoConfig`` / ``AutoModelForCausalLM`` /
  ``AutoTokenizer`` load with ``trust_remote_code=True`` where rltok is not installed: the three
  files above and the rltok modules they import, copied from this rltok with their imports made
  flat (:func:`rltok.hf.bundle.bundle_files`); ``rltok.from_pretrained``, ``rltok.load`` and every
  rltok command read the same folder from its JSON and safetensors only. It is what
  ``model.save_pretrained(DIR)`` writes by default (``rltok.hub``; not for the flat baselines);
* :func:`register` makes the Auto classes know these classes (no remote code is run then).

Only ``rltok.hf.format`` (reading an export's config.json) and ``rltok.hf.bundle`` (writing an
export: ``rltok.hub.save_pretrained`` uses it) are importable without transformers.
"""

from __future__ import annotations

__all__ = ["RltokConfig", "RltokForCausalLM", "RltokByteTokenizer", "save_for_transformers", "to_transformers",
           "register", "bundle_files"]

_WHERE = {"RltokConfig": "configuration_rltok", "RltokForCausalLM": "modeling_rltok",
          "RltokPreTrainedModel": "modeling_rltok", "RltokByteTokenizer": "tokenization_rltok",
          "save_for_transformers": "export", "to_transformers": "export", "register": "export",
          "bundle_files": "bundle"}


def __getattr__(name: str):
    # imported on use, so that rltok.hf.format (read by rltok.from_pretrained) needs no transformers
    if name not in _WHERE:
        raise AttributeError(name)
    import importlib

    try:
        mod = importlib.import_module(f"{__name__}.{_WHERE[name]}")
    except ImportError as e:
        if getattr(e, "name", None) == "transformers":
            raise ImportError("rltok.hf needs transformers: pip install 'rltok[hf]'") from e
        raise
    return getattr(mod, name)
