"""results/rates/results.json's ``cells`` list (issue 38): one row per trained model and evaluated
rate, from the records beside this script, in the prose study's layout: tag, seed, bytes, corpus,
the rate at evaluation (and the requested rate where there is one), training FLOPs per byte at
that rate, and test bits/byte (validation where the record has no test split). The issue-15 runs'
``runs`` and ``conditioned`` entries (built by summarize.py) are kept as they are.

    python results/rates/collect.py

FLOPs per byte are counted on the model the record's preset and settings build (no weights
needed: the count depends on the shapes and the rate)."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

HERE = Path(__file__).resolve().parent
BYTES = {"2M": 2_000_000, "3M": 3_000_000, "8M": 8_000_000}


@lru_cache(maxsize=None)
def _model(preset: str, settings: tuple[str, ...]):
    from rltok.config import build_config
    from rltok.run import build_model

    cfg = build_config("rl", preset, overrides=dict(s.split("=", 1) for s in settings))
    return build_model(cfg), cfg


def flops_per_byte(preset: str, settings: tuple[str, ...], rate: float) -> float:
    from rltok.flops import training_flops_per_byte

    model, cfg = _model(preset, settings)
    return float(training_flops_per_byte(model, cfg, rate).per_byte)


def knots_cells() -> list[dict]:
    rec = json.loads((HERE / "knots_tiny.json").read_text())
    settings = tuple(rec["settings"].split())
    cells = []
    for r in rec["rows"]:
        cells.append({"tag": "conditioned-knots", "seed": r["seed"], "bytes": BYTES[rec["bytes"]], "corpus": rec["data"],
                      "requested_rate": r["requested_rate"], "rate_matched": "calibrated on validation",
                      "rate": r["calibrated_test_rate"], "test_bpb": r["calibrated_test_bpb"],
                      "val_rate_uncalibrated": r["raw_rate"], "val_bpb_uncalibrated": r["raw_bpb"],
                      "flops_per_byte": flops_per_byte(rec["preset"], settings, r["calibrated_test_rate"]),
                      "record": "knots_tiny.json"})
    return cells


def price_cells() -> list[dict]:
    path = HERE / "price_tiny.json"
    if not path.is_file():
        return []
    rec = json.loads(path.read_text())
    return [{"tag": f"price-{r['flop_price']:g}", "seed": r["seed"], "bytes": BYTES[rec["bytes"]], "corpus": rec["data"],
             "flop_price": r["flop_price"], "requested_rate": None, "rate": r["test_rate"], "test_bpb": r["test_bpb"],
             "val_rate": r["val_rate"], "val_bpb": r["val_bpb"], "flops_per_byte": r["flops_per_byte"],
             "record": "price_tiny.json"} for r in rec["rows"]]


def issue15_cells(results: dict) -> list[dict]:
    """The issue-15 runs (english corpus, 3 MB, seed 42, scored on validation only)."""
    return [{"tag": tag, "seed": 42, "bytes": 3_000_000, "corpus": "english", "requested_rate": None,
             "rate": r["rate"], "test_bpb": None, "val_bpb": r["bpb"], "flops_per_byte": r["flops_per_byte"],
             "record": "results.json runs (summarize.py)"} for tag, r in results.get("runs", {}).items()]


def main() -> int:
    path = HERE / "results.json"
    results = json.loads(path.read_text()) if path.is_file() else {}
    results["cells"] = issue15_cells(results) + knots_cells() + price_cells()
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"{len(results['cells'])} cells written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
