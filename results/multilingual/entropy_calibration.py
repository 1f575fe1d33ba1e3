"""Where entropy patching's threshold lands on each text (issue 39; the figures docs/methods.md
§ entropy quotes): per entropy run, the rate of the run's own threshold on
  heldout      the held-out documents of its setup (em_holdout_bytes, never trained on; what
               calibrated θ up to format 13),
  calibration  the first em_calibration_rows training rows (what calibrates θ from format 14),
  later_rows   1,024 training rows from the 10,000th on (the sampler's own order and packing),
  validation   the validation documents as an evaluation counts them (each from its own BOS,
               every byte: rltok.evaluate.corpus_rate, whole, fp32), and their first windows (BOS + 511 bytes).

    python results/multilingual/entropy_calibration.py runs/multilingual-flores/entropy_s1 \
        runs/multilingual-flores-superseded/entropy_s42.heldout-calibration   # -> entropy_calibration.json

A record per run, keyed by the run folder's parent and name; runs not given keep their record."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

import rltok
from rltok.boundaries.entropy import _held_out_entropies, _load_em, _row_entropies, entropy_model_docs, rule_rate
from rltok.data import load_splits
from rltok.data.loader import SequenceDataset
from rltok.evaluate import corpus_rate
from rltok.run import read_config

RECORD = Path(__file__).with_name("entropy_calibration.json")
LATER = 10_000  # an 8 MB run trains on ~15,600 rows of 512


def measure(run: Path) -> dict:
    cfg = read_config(run)
    bc = cfg.boundary
    splits = load_splits(cfg)
    em, info = _load_em(bc, run)
    held = entropy_model_docs(bc, splits.train)[1]  # the setup's held-out documents
    total = sum(map(len, held))
    ds = SequenceDataset(splits.train, cfg.model.seq_len, cfg.train.seed, cfg.data.packing)
    n = bc.em_calibration_rows
    sets = {"heldout": _held_out_entropies(em, held, cfg.model.seq_len),
            "calibration": _row_entropies(em, ds.batch(np.arange(n, dtype=np.int64)).ids),
            "later_rows": _row_entropies(em, ds.batch(np.arange(LATER, LATER + n, dtype=np.int64)).ids)}
    out = {"threshold": bc.threshold, "rule": bc.rule, "target_rate": bc.target_rate,
           "calibrate_on": getattr(bc, "calibrate_on", "heldout"), "recorded_rate": info.get("rate"),
           "heldout_docs": len(held), "heldout_bytes": total, "rates": {}}
    for name, (e, valid, forced) in sets.items():
        out["rates"][name] = {"rate": rule_rate(e, valid, forced, bc.rule, bc.threshold), "bytes": int(valid.sum())}
    model = rltok.load(run)  # the run's own router (its threshold), scored as evaluations score
    for name, whole in (("validation", True), ("validation_first512", False)):
        out["rates"][name] = {"rate": corpus_rate(model, splits.val, cfg.model.seq_len, whole=whole, batch_size=16,
                                                  dtype="fp32"), "docs": len(splits.val)}
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    rec = json.loads(RECORD.read_text()) if RECORD.is_file() else {}
    for a in argv:
        run = Path(a)
        key = f"{run.parent.name}/{run.name}"
        rec[key] = measure(run)
        print(key, {k: round(v["rate"], 4) for k, v in rec[key]["rates"].items()}, file=sys.stderr)
        RECORD.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
