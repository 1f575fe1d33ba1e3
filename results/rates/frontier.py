"""Issue 38's rate–compute frontier on prose: bits/byte against training FLOPs per byte, `tiny`
preset, `--data prose` (the prose study's corpus and split), 3 seeds per point.

Rows (one training run per row and seed):
  rl_r{R}       rl with the study's integral controller (anti-windup) at target rate R
  uniform_r{R}  uniform chunks at R
  cond          one rate-conditioned rl (rates drawn from uniform:0.1:0.4 in training, offset
                knots), scored at each R: the request set, then the trim calibrated to R
  hinge         rl with the one-sided rate loss (ceiling 0.2)
  price_{λ}     rl without the rate penalty, a compute price λ in the REINFORCE reward
  opt_*         the five options never measured (rows `options`), each rl at 0.2 with the study's
                controller plus one option, against rl_r0.2: the off-policy warm start (the first
                10% of the training bytes; the paper's runs disable it and give no length), whitespace
                prescribed, the deviation upsampler, mean pooling, one shared head
R in RATES. At every rung of the prose study (2, 8, 32 MB), rl_r0.2, uniform_r0.2 and the
FLOP-matched BPE-token LM are the study's `rl`, `uniform` and `bpe-lm` cells (same settings, seeds,
corpus and test set), read from results/study-prose/cells/RUNG/ and not trained again.

Measurement, as the study's `test` set: every byte of every document of the prose test split
(1,000 documents), scored in windows; a router with a rate knob is calibrated to the point's rate
on the prose validation split (BOS + first 512 bytes of 128 documents) and, if the test split then
misses by more than 0.005, read at the rate between two scorings (rltok.evaluate.score_at_rate);
a priced or hinge run is scored as it stands (its rate is the result). FLOPs per byte: training
FLOPs at the rate the run trained at (`flops_per_byte_train`, its mean rate over training: the
compute it cost; one value for the conditioned model at every rate it is scored at), and at the rate
measured on the test split (`flops_per_byte`: what a forward pass at that rate costs per byte).

    python results/rates/frontier.py --bytes 8M --seeds 1,2,3 [--rows rl,uniform,cond,hinge,price] [--prices 0.05]
    python results/rates/frontier.py --bytes 2M,8M,32M --rows rl --seeds 1,2,3   # the best rate vs budget
    python results/rates/frontier.py --bytes 2M,8M --rows rl --rates 0.05   # past the edge of RATES

Resumable: a run with a summary is not trained again, a finished point is not measured again.
Records: results/rates/frontier_runs/BYTES/TAG_sSEED (each trained run's config, summary and
metrics, no weights); results/rates/frontier.json (one row per point: bytes, tag, seed, requested rate, rate,
bpb, bpb SE, FLOPs per byte in training and at the test rate, whitespace recall, how the rate was
matched). Rows recorded before `flops_per_byte_train` existed get it from their run (or the study's
cell) the next time this script starts."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
# the prose study's controller and rate-matching settings: the frontier's points are measured as its cells
from study_prose import CAL_DOCS, CAL_TOL, HOLD, MATCH_TOL  # noqa: E402
from study_prose import LADDER  # noqa: E402  (the study's rows per rung: the points it measures for us)
from study_prose import OUT as STUDY_OUT  # noqa: E402  (RLTOK_STUDY_RESULTS: a frozen checkout reads the live cells)

from rltok.cli import parse_size  # noqa: E402

RECORD = Path(__file__).with_name("frontier.json")
STUDY_CELLS = STUDY_OUT / "cells"
RATES = (0.1, 0.15, 0.2, 0.3, 0.4)
COND = ["boundary.rate_schedule=uniform:0.1:0.4", "boundary.rate_offset_knots=5", *HOLD]
OPTIONS = {"opt_warm_start": "boundary.warm_start_bytes={warm}", "opt_prescribed": "boundary.prescribed=whitespace",
           "opt_deviation": "dechunker.upsample=deviation", "opt_mean_pool": "chunker.pool=mean",
           "opt_shared_head": "model.shared_head=true"}
STUDY_TAG = {"rl_r0.2": "rl", "uniform_r0.2": "uniform", "bpe-lm": "bpe-lm"}  # read from the study's cells


def runs_of(rows: list[str], prices: list[float], size: str = "8M",
            rates: tuple[float, ...] = RATES) -> dict[str, tuple[str, list[str], tuple]]:
    """tag -> (method, --set overrides, the rates the run is scored at; () for its own rate).
    ``rates``: the fixed-rate rl and uniform rows; the conditioned model is scored at RATES, its
    trained range, whatever they are."""
    out: dict[str, tuple[str, list[str], tuple]] = {}
    for r in rates:
        if "rl" in rows:
            out[f"rl_r{r:g}"] = ("rl", [*HOLD, f"boundary.target_rate={r:g}"], (r,))
        if "uniform" in rows:
            out[f"uniform_r{r:g}"] = ("uniform", [f"boundary.target_rate={r:g}"], (r,))
    if "cond" in rows:
        out["cond"] = ("rl", COND, RATES)
    if "hinge" in rows:
        out["hinge"] = ("rl", ["boundary.rate_loss=hinge"], ())
    if "price" in rows:
        for lam in prices:
            out[f"price_{lam:g}"] = ("rl", ["boundary.rate_weight=0", f"boundary.flop_price={lam:g}"], ())
    if "options" in rows:
        for tag, opt in OPTIONS.items():
            out[tag] = ("rl", [*HOLD, opt.format(warm=parse_size(size) // 10)], (0.2,))
    if "bpe-lm" in rows:
        out["bpe-lm"] = ("bpe-lm", ["flat.vocab_size=8192"], ())
    return out


def train(run: Path, method: str, sets: list[str], size: str, seed: int) -> None:
    if (run / "summary.json").is_file():
        return
    cmd = [sys.executable, "-m", "rltok", "train", "--method", method, "--preset", "tiny", "--data", "prose",
           "--bytes", size, "--seed", str(seed), "--threads", "1", "--no-progress", "--out", str(run)]
    for s in sets:
        cmd += ["--set", s]
    if (run / "config.json").is_file():
        cmd.append("--resume")
    run.parent.mkdir(parents=True, exist_ok=True)
    with open(run.parent / f"{run.name}.log", "a") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})


def measure(run: Path, rate: float | None, docs: int | None = None) -> dict:
    """The point of ``run`` at ``rate`` (None: as it stands) on the prose test split."""
    import rltok
    from rltok.data import load_splits
    from rltok.evaluate import calibrate_rate, evaluate_corpus, rate_knob, score_at_rate
    from rltok.flops import training_flops_per_byte
    from rltok.rates import requested_rate, schedule_of

    model = rltok.load(run)
    cfg = model.run_config
    splits = load_splits(cfg)
    kw = dict(dtype=cfg.train.dtype, batch_size=16)
    sched = schedule_of(model)
    conditioned = rate is not None and sched is not None and sched.conditioned
    row: dict = {"requested_rate": rate}
    with requested_rate(model, rate if conditioned else None):
        if rate is None or rate_knob(model) is None:
            res = evaluate_corpus(model, splits.test, cfg.model.seq_len, whole=True, docs=docs, **kw)
            row["rate_match"] = "as trained" if rate_knob(model) is not None else "exact"
        else:
            c = calibrate_rate(model, splits.val, cfg.model.seq_len, rate, docs=CAL_DOCS, tol=CAL_TOL, **kw)
            res, match = score_at_rate(model, splits.test, cfg.model.seq_len, rate, calibration=splits.val,
                                       cal_docs=CAL_DOCS, cal_tol=CAL_TOL, tol=MATCH_TOL,
                                       score_kw={"whole": True, "docs": docs}, **kw)
            row["calibration"] = {"value": c.value, "rate": c.rate, "before_value": c.before_value,
                                  "before_rate": c.before_rate}
            row["rate_match"] = asdict(match)
    row.update(rate=res.rate, bpb=res.bpb, bpb_se=res.bpb_se, docs=res.docs, bytes_scored=res.bytes,
               whitespace_recall=res.whitespace_recall, word_start_recall=res.word_start_recall,
               boundary_enrichment=res.boundary_enrichment, per_doc_bpb=res.per_doc_bpb)
    row["flops_per_byte"] = training_flops_per_byte(model, cfg, res.rate).per_byte  # tokens per byte for bpe-lm
    row.update(train_compute(run, model))
    summary = json.loads((run / "summary.json").read_text())
    row.update(train_seconds=summary.get("train_seconds"), dtype=summary.get("dtype"),
               val_rate_end_of_training=summary.get("val_rate"))
    return row


def train_compute(run: Path, model=None) -> dict:
    """What ``run`` cost to train: FLOPs per byte at its mean training rate, and that rate. ``run``
    may be a kept record (config, summary, metrics; no weights): the FLOPs need only the shapes."""
    from rltok.compare import training_record
    from rltok.run import build_model, read_config

    if model is None:
        cfg = read_config(run)
        model = build_model(cfg, run)
        model.run_config = cfg
    t = training_record(run, model)
    return {"flops_per_byte_train": t["flops_per_byte"], "train_rate": t["train_rate"]}


def keep_records(run: Path, dest: Path) -> None:
    """Copy a run's JSON records (config, summary, metrics; never weights) to ``dest``: the
    training rate and compute of a point outlive the run directory."""
    import shutil

    from rltok.run import CONFIG, METRICS, SUMMARY

    if not (run / SUMMARY).is_file():
        return
    dest.mkdir(parents=True, exist_ok=True)
    for f in (CONFIG, SUMMARY, METRICS):
        if (run / f).is_file():
            shutil.copy2(run / f, dest / f)


def estimated_train_compute(row: dict) -> dict | None:
    """For a fixed-rate rl or uniform row whose run and records are gone: the FLOPs per byte of its
    settings at its requested rate (uniform trains at exactly that rate; rl's controller holds it
    to within about 0.5% over training, e.g. 8 MB rl seed 1 of the prose study: 0.2009 at 0.2)."""
    from rltok.config import build_config
    from rltok.flops import training_flops_per_byte
    from rltok.run import build_model

    if row.get("requested_rate") is None or family_of(row["tag"]) not in ("rl", "uniform"):
        return None
    cfg = build_config(row["method"], "tiny", overrides=dict(s.split("=", 1) for s in row["overrides"]))
    f = training_flops_per_byte(build_model(cfg), cfg, row["requested_rate"]).per_byte
    return {"flops_per_byte_train": f, "train_rate": None,
            "train_compute_from": "its settings at the requested rate (the run's records are gone)"}


def family_of(tag: str) -> str:
    return tag.split("_r")[0] if tag.startswith(("rl_r", "uniform_r")) else tag


def backfill_train_compute(rec: dict, out: Path, kept: Path | None = None) -> list[str]:
    """Give rows recorded before ``flops_per_byte_train`` existed their training compute, from the
    study's cell, the run, its kept records, or (fixed-rate rows) an estimate from its settings;
    the rows with none of these are returned, left as they are."""
    missing, cache = [], {}
    for r in rec["rows"]:
        if "flops_per_byte_train" in r:
            continue
        key = (r["bytes"], r["tag"], r["seed"])
        if key not in cache:
            if r.get("from", "").startswith("prose study "):
                cell = STUDY_CELLS / r["bytes"] / f"{STUDY_TAG[r['tag']]}_s{r['seed']}.json"
                c = json.loads(cell.read_text()) if cell.is_file() else None
                cache[key] = c and {"flops_per_byte_train": c["flops_per_byte_train"], "train_rate": c.get("train_rate")}
            else:
                name = f"{r['tag']}_s{r['seed']}"
                runs = [d for d in (out / r["bytes"] / name, kept and kept / r["bytes"] / name)
                        if d and (d / "summary.json").is_file()]
                cache[key] = train_compute(runs[0]) if runs else estimated_train_compute(r)
        if cache[key] is None:
            missing.append(f"{r['bytes']} {r['tag']} s{r['seed']}")
        else:
            r.update(cache[key])
    return missing


def study_point(size: str, tag: str, seed: int) -> dict | None:
    """A point the prose study measured the same way (its `test` set), or None if not yet."""
    p = STUDY_CELLS / size / f"{STUDY_TAG[tag]}_s{seed}.json"
    if not p.is_file():
        return None
    c = json.loads(p.read_text())
    t = c["test"]
    rate = t.get("rate")
    return {"requested_rate": float(tag.split("_r")[1]) if "_r" in tag else None,
            "rate": rate, "bpb": t["bpb"], "bpb_se": t["bpb_se"], "docs": t["docs"], "bytes_scored": t["bytes"],
            "whitespace_recall": t.get("whitespace_recall"), "word_start_recall": t.get("word_start_recall"),
            "boundary_enrichment": t.get("boundary_enrichment"), "per_doc_bpb": t.get("per_doc_bpb"),
            "flops_per_byte": t.get("flops_per_byte", c["flops_per_byte_train"]),
            "flops_per_byte_train": c["flops_per_byte_train"], "train_rate": c.get("train_rate"),
            # cells measured before score_at_rate existed have no rate_match: calibrated, or exact
            "rate_match": (t.get("rate_match") or {}).get("how", "calibrated" if t.get("calibrated") else "exact"),
            # named from the study's results folder: a frozen worktree's ROOT does not hold it
            "from": f"prose study {p.relative_to(STUDY_CELLS.parent).as_posix()}"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", default="8M", help="comma-separated: 2M, 8M, 32M")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--rows", default="rl,uniform,cond,hinge,price,bpe-lm,options")
    ap.add_argument("--prices", default="", help="compute prices λ for the price rows")
    ap.add_argument("--rates", default=",".join(f"{r:g}" for r in RATES),
                    help="target rates of the fixed-rate rl and uniform rows (default: %(default)s)")
    ap.add_argument("--out", default=str(ROOT / "runs" / "frontier"))
    ap.add_argument("--record", default=str(RECORD))
    ap.add_argument("--docs", type=int, default=None, help="score only the first N test documents (a smoke check)")
    args = ap.parse_args()
    rows = args.rows.split(",")
    prices = [float(p) for p in args.prices.split(",") if p]
    try:
        rates = tuple(float(r) for r in args.rates.split(",") if r)
    except ValueError:
        ap.error(f"--rates: not a comma-separated list of numbers: {args.rates!r}")
    if not rates or not all(0 < r < 1 for r in rates):
        ap.error(f"--rates: every rate must lie in (0, 1): {args.rates!r}")
    from rltok.checkpoint import write_json_atomic

    record = Path(args.record)
    if args.docs is not None and record.resolve() == RECORD.resolve():
        ap.error("--docs (a smoke check) needs --record elsewhere: its partial points would count as finished")
    rec = json.loads(record.read_text()) if record.is_file() else {"preset": "tiny", "data": "prose", "rows": []}
    have = {(r["bytes"], r["tag"], r["seed"], r["requested_rate"]) for r in rec["rows"]}
    kept = record.with_name(record.stem + "_runs")  # each trained run's records, beside the record
    if any("flops_per_byte_train" not in r for r in rec["rows"]):
        missing = backfill_train_compute(rec, Path(args.out), kept)
        if missing:
            print(f"no run to read the training FLOPs of: {', '.join(sorted(set(missing)))}", flush=True)
        write_json_atomic(record, rec)
    for seed in (int(s) for s in args.seeds.split(",")):
        for size in args.bytes.split(","):
            for tag, (method, sets, scored_at) in runs_of(rows, prices, size, rates).items():
                todo = [r for r in (scored_at or (None,)) if (size, tag, seed, r) not in have]
                if not todo:
                    continue
                if tag in STUDY_TAG and STUDY_TAG[tag] in LADDER.get(size, ()):
                    point = study_point(size, tag, seed)
                    if point is None:
                        print(f"{size} {tag} s{seed}: waits for the prose study's cell", flush=True)
                        continue
                    points = [point]
                else:
                    run = Path(args.out) / size / f"{tag}_s{seed}"
                    train(run, method, sets, size, seed)
                    keep_records(run, kept / size / run.name)
                    points = (measure(run, r, args.docs) for r in todo)  # each kept as soon as it is measured
                for p in points:
                    row = {"bytes": size, "tag": tag, "method": method, "seed": seed, "overrides": sets, **p}
                    rec["rows"].append(row)
                    have.add((size, tag, seed, p["requested_rate"]))
                    write_json_atomic(record, rec)
                    print(f"{size} {tag} s{seed} at {p['requested_rate']}: rate {p['rate']:.3f} bpb {p['bpb']:.4f} "
                          f"FLOPs/byte {p['flops_per_byte_train'] / 1e6:.2f}M in training, "
                          f"{p['flops_per_byte'] / 1e6:.2f}M at that rate", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
