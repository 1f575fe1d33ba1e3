"""``save_pretrained`` / ``from_pretrained`` / ``push_to_hub`` as methods of rltok's model classes,
in the manner of ``huggingface_hub.PyTorchModelHubMixin``; the work is ``rltok.hub``'s.

``rltok.hub`` sits above the models: saving needs the run layout, loading needs the methods
registry, which imports every model. So no model module imports it: the package root
(``rltok/__init__.py``, which every import of rltok runs first) hands this module a function that
loads it (:func:`provide`), and the methods below call that at call time. The same holds for
``ByteUNet.generate`` (``rltok.generate``, the sampling loop above the model).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Callable

from ..errors import RltokError

_providers: dict[str, Callable[[], ModuleType]] = {}


def provide(name: str, load: Callable[[], ModuleType]) -> None:
    """Set the function that returns the module ``rltok.<name>`` (the package root calls it)."""
    _providers[name] = load


def upper(name: str) -> ModuleType:
    """The module ``rltok.<name>`` from above the models (``hub``, ``generate``)."""
    if name not in _providers:
        raise RltokError(f"rltok.{name} is not loaded (the rltok package provides it when imported)")
    return _providers[name]()


def _hub() -> ModuleType:
    return upper("hub")


class HubMixin:
    """``save_pretrained`` / ``from_pretrained`` / ``push_to_hub`` on rltok's model classes."""

    def save_pretrained(self, save_directory: str | Path, *, push_to_hub: bool = False,
                        repo_id: str | None = None, transformers: bool | None = None, **push_kwargs) -> Path:
        # transformers: None = the export transformers' Auto classes load (rltok's layout for the
        # flat baselines), False = rltok's own layout, True = the export or an error (rltok.hub)
        out = _hub().save_pretrained(self, save_directory, transformers=transformers)
        if push_to_hub:
            self.push_to_hub(repo_id or Path(save_directory).name, transformers=transformers, **push_kwargs)
        return out

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, **kwargs):
        model = _hub().from_pretrained(name_or_path, **kwargs)
        if not isinstance(model, cls):
            raise RltokError(f"{name_or_path}: holds a {type(model).__name__} ({model.run_config.method}), "
                             f"not a {cls.__name__}: load it with rltok.from_pretrained")
        return model

    def push_to_hub(self, repo_id: str, **kwargs):
        return _hub().push_to_hub(self, repo_id, **kwargs)

    def model_card(self):
        hub = _hub()
        return hub.model_card(self, hub.final_summary(self))
