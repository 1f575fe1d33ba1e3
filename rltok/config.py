"""Resolving a run's configuration: named presets and recipes, and the method's own config class.

Resolution order, each layer overriding the previous one:

1. the dataclass defaults (the method's config class supplies the method defaults),
2. the preset (model size and optimisation; ``smoke``, ``tiny``, the paper's sizes),
3. an optional recipe (a named bundle of method settings, e.g. ``paper-policy``),
4. ``--set key=value`` overrides from the command line.

The dataclasses themselves, the token ids and the override parser are in ``rltok.schema`` (which
every part of rltok imports), the presets and recipes in ``rltok.presets``; both are re-exported
here.
"""

from __future__ import annotations

from typing import Any

from .errors import RltokError
from .flat.config import FORMER_BOUNDARY_KEYS
from .methods import get_method
from .schema import *  # noqa: F401,F403  (the public names of the typed configuration)
from .schema import FORMAT_VERSION, ChunkerConfig, DechunkerConfig, RunConfig, _apply, _check, apply_overrides
from .presets import PRESETS, RECIPE_TARGETS, RECIPES  # noqa: F401  (re-exported)


def build_config(method: str | None = "rl", preset: str | None = "tiny", recipe: str = "",
                 overrides: list[str] | dict[str, Any] | None = None) -> RunConfig:
    """Resolve defaults -> preset -> recipe -> overrides into a validated RunConfig.

    ``method``/``preset`` None: the recipe's (if it names them), else rl / tiny."""
    if recipe and recipe not in RECIPES:
        raise RltokError(f"unknown recipe {recipe!r}; choose one of: {', '.join(RECIPES)}")
    named = RECIPES.get(recipe, {}) if recipe else {}
    method = method or named.get("method", "rl")
    preset = preset or named.get("preset", "tiny")
    spec = get_method(method)
    if preset not in PRESETS:
        raise RltokError(f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}")
    cfg = RunConfig(method=method, preset=preset, recipe=recipe, boundary=spec.config_cls())
    if spec.flat:  # a flat baseline: its own options, and no stage parts
        cfg.flat, cfg.chunker, cfg.dechunker = spec.flat_cls(), None, None
    # presets hold model, train and data keys only, which every method has: applied strictly
    for key, value in PRESETS[preset].items():
        _apply(cfg, key, value, strict=True)
    # method-specific preset settings live with the method (MethodSpec.preset_overrides), so a
    # key meant for one method never reaches another method's field of the same name
    for key, value in spec.preset_overrides.get(preset, {}).items():
        _apply(cfg, key, value, strict=True)
    # a recipe's method keys reach the methods that have them (paper-policy on rl, not uniform);
    # a recipe meant for this method (its "method") is applied strictly
    strict_recipe = named.get("method") == method
    for key, value in named.items():
        if key not in RECIPE_TARGETS:
            _apply(cfg, key, value, strict=strict_recipe)
    apply_overrides(cfg, overrides)
    return check_stages(cfg.validate())


def check_stages(cfg: RunConfig) -> RunConfig:
    """model.stages > 1 only for a method whose build has that many stages."""
    _check(get_method(cfg.method).stages >= cfg.model.stages,
           f"model.stages={cfg.model.stages}: method {cfg.method!r} has one stage only (two-stage U-Nets: --method rl)")
    return cfg


def run_config_from_dict(d: dict[str, Any], strict: bool = False, format_version: int | None = None) -> RunConfig:
    """:meth:`RunConfig.from_dict` with the method's config class (a run directory's config.json)."""
    method = d.get("method", "rl")
    _check(isinstance(method, str), f"method={method!r} must be a string")
    spec = get_method(method)
    fmt = FORMAT_VERSION if format_version is None else format_version
    if fmt < 8:
        d = _format_8_sections(d, spec.flat)
    boundary = d.get("boundary")
    if fmt < 11 and isinstance(boundary, dict) and boundary.get("flop_price", 0) and "flop_price_in" not in boundary:
        d = {**d, "boundary": {**boundary, "flop_price_in": "loss"}}  # what that run did
    boundary = d.get("boundary")
    if fmt < 14 and method == "entropy" and isinstance(boundary, dict) and "calibrate_on" not in boundary:
        d = {**d, "boundary": {**boundary, "calibrate_on": "heldout"}}  # what that run did
    return RunConfig.from_dict(d, spec.config_cls, strict=strict, format_version=format_version,
                               flat_cls=spec.flat_cls)


def _format_8_sections(d: dict[str, Any], flat: bool) -> dict[str, Any]:
    """Up to format 7 every option lived under boundary.*: a flat baseline's own (its window as
    ``attn_window``) move to the flat section, the stage parts' (upsample, pool, scan_block) to
    chunker and dechunker, which take their defaults where a run had no such key (its method
    had no such option: the defaults are what it did). A flat baseline has no parts."""
    boundary = dict(d.get("boundary") or {})
    if not isinstance(d.get("boundary", {}), dict):
        return d  # from_dict names the error
    pool = boundary.pop("pool", ChunkerConfig.pool)
    parts = {"chunker": {"pool": "" if pool == "last" else pool},  # last was rl's own
             "dechunker": {"upsample": boundary.pop("upsample", DechunkerConfig.upsample),
                           "scan_block": boundary.pop("scan_block", DechunkerConfig.scan_block)}}
    if not flat:
        return {**parts, **d, "boundary": boundary}
    moved = {new: boundary.pop(old) for old, new in FORMER_BOUNDARY_KEYS.items() if old in boundary}
    return {"flat": moved, **d, "boundary": boundary}
