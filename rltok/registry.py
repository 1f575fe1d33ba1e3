"""What a method registers: :class:`MethodSpec`, and the table it is registered in.

Two kinds of method share one table of names (``--method``):

* a **boundary method** (``rltok/boundaries/``): a router plus stage parts inside the byte-level
  U-Net; its options are the ``boundary.*`` section (``config_cls``);
* a **flat baseline** (``rltok/flat/``): a Transformer with no hierarchy; its options are the
  ``flat.*`` section (``flat_cls``), and its ``boundary.*`` section is the base
  :class:`~rltok.schema.BoundaryConfig` of the U-Net it is matched to (``target_rate``).

The table knows no method: each method's module registers itself on import, and ``rltok.methods``
imports them all and looks names up. This module imports only the typed configuration, so every
method module can import it without a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from torch import nn

from .schema import BoundaryConfig, RunConfig


@dataclass
class MethodSpec:
    """A registered method: its config classes, how to build its model, optional setup."""

    name: str
    config_cls: type[BoundaryConfig]
    build: Callable[[RunConfig, Path | None], nn.Module]
    description: str = ""
    # defaults per preset that only this method needs, e.g. {"tiny": {"boundary.x": 1}}
    preset_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    # called once before training with (config, training corpus, run directory), e.g. to train
    # a tokenizer and store it in the run directory
    setup: Callable[..., None] | None = None
    stages: int = 1  # the most U-Net stages its build supports (model.stages)
    # a flat baseline's options (the flat.* section); None for a boundary method
    flat_cls: type | None = None

    @property
    def flat(self) -> bool:
        return self.flat_cls is not None


_METHODS: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
    """Add a method to the table (``rltok.methods`` looks methods up, after importing every
    method module)."""
    _METHODS[spec.name] = spec
    return spec
