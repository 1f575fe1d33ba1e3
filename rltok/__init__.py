"""rltok: learned tokenization end to end.

A byte-level autoregressive U-Net whose chunk boundaries ("tokens") are chosen by a policy trained
with REINFORCE (Dauncey & Wattenhofer, ICML 2026), with every baseline in one harness.

    >>> import rltok
    >>> model = rltok.load("runs/tiny")
    >>> res = rltok.score(model, ["The city council met on Tuesday."])
    >>> rltok.segment(model, "The city council met on Tuesday.")
"""

from __future__ import annotations

from .model import hub_mixin as _hub_mixin
from .version import __version__

__all__ = ["load", "from_pretrained", "score", "segment", "encode", "encode_batch", "Encoding", "__version__"]


def __getattr__(name: str):
    # imported lazily so that `rltok --help` does not pay for importing torch
    if name in ("load", "score", "segment", "encode", "encode_batch", "Encoding"):
        from . import api

        return getattr(api, name)
    if name == "from_pretrained":
        from .hub import from_pretrained

        return from_pretrained
    raise AttributeError(name)


def _load_hub():
    from . import hub

    return hub


def _load_generate():
    from . import generate

    return generate


# the models' save_pretrained / from_pretrained / generate call rltok.hub and rltok.generate, which
# sit above them: the package root wires them in, so that no model module imports upward
# (rltok/model/hub_mixin.py)
_hub_mixin.provide("hub", _load_hub)
_hub_mixin.provide("generate", _load_generate)
