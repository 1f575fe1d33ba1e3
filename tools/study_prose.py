"""Issue 36: the replication study on real prose -- Wikipedia and books, leak-free splits, whole
documents scored, rates matched on every evaluation set, five seeds where the answer is close.

    python tools/study_prose.py run --rungs 2M --jobs 2          # train + measure (resumable)
    python tools/study_prose.py plan --rungs 2M,8M,32M           # cells, done or not
    python tools/study_prose.py report                           # results.json, tables, plots, README block

From a frozen checkout, point it at the live one's folders: RLTOK_STUDY_RESULTS=results/study-prose
RLTOK_STUDY_RUNS=runs/study-prose RLTOK_SHARED_DATA=../shared/data (as tools/study.py).

The design, and the comparisons tested, are written in results/study-prose/README.md before the
runs. In short:

* data: ``--data prose`` (rltok/data/prose.py): English Wikipedia + 221 Project Gutenberg books,
  split by article / by author before anything is cut, near-duplicates across splits removed;
  every cell at a rung reads the same training bytes in a seed's order, never a byte twice;
* a cell: ``rltok train --preset tiny --data prose --bytes RUNG --seed SEED`` with the tag's
  overrides, one thread, in runs/study-prose/RUNG/TAG_sSEED (resumed where cut short), then
  measured in-process; its record in results/study-prose/cells/RUNG/TAG_sSEED.json;
* evaluation sets, every byte of every document scored (``whole``, windows of seq_len):
  ``test`` (the prose test split; the paper's first-512-bytes protocol beside it as ``test512``),
  ``c4`` (C4 train-split documents 200-999 of ../shared/data/webtext/c4/c4_sample.jsonl),
  ``wikitext`` (all of WikiText-2 test, one document per article) and ``docs_domain`` (the first
  128 documents of the ``english`` corpus's test split: technical documentation);
* rates: a router with a rate knob (rl's logit offset, hnet's threshold, nawrot's logit offset)
  is calibrated to r* = 0.2 on a held-out slice of each evaluation domain before that set is
  scored (``CALIBRATE``); the others run at their own rate (uniform and stride are exact);
  FLOPs per byte are counted at the training rate and at each set's evaluation rate;
* rl's integral controller with anti-windup (``boundary.rate_antiwindup``), and the paper's
  penalty-only ``rl-penalty`` at every rung.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import study as v2  # noqa: E402  (the v2 study's cell scheduling: next_cell, watch_cell, machine_pace)

OUT = Path(os.environ.get("RLTOK_STUDY_RESULTS", ROOT / "results" / "study-prose"))
RUNS = Path(os.environ.get("RLTOK_STUDY_RUNS", ROOT / "runs" / "study-prose"))
SHARED = Path(os.environ.get("RLTOK_SHARED_DATA", ROOT.parent / "shared" / "data"))
RUNGS = {"2M": 2_000_000, "8M": 8_000_000, "32M": 32_000_000}
COMMON = ["--preset", "tiny", "--data", "prose"]
# rltok's integral controller, with anti-windup (the v2 study's offset drifted toward its clamp)
HOLD = ["boundary.rate_integral_gain=1", "boundary.rate_antiwindup=true"]
# GPT-NeoX-20B's BPE as `rltok data fetch-evals` stores it (rltok.tasks.evals_dir)
NEOX = Path(os.environ.get("RLTOK_CACHE", Path.home() / ".cache" / "rltok")) / "evals" / "gpt-neox-20b.json"
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "rl": ("rl", HOLD),
    "rl-penalty": ("rl", []),  # the paper's rate control only
    "uniform": ("uniform", []),
    "nawrot": ("nawrot", []),
    "hnet": ("hnet", ["boundary.rate_control=threshold"]),
    "bpe": ("bpe", []),
    "bpe-lm": ("bpe-lm", ["flat.vocab_size=8192"]),
    "bytes": ("bytes", []),  # FLOP-matched flat byte LM
    "rl-paper": ("rl", ["boundary.window=8", "boundary.scale=0.0625", *HOLD]),
    "stride": ("stride", []),
    "whitespace": ("whitespace", []),
    "rl-2stage": ("rl", ["model.stages=2", *HOLD]),
    "bytes-params": ("bytes", ["flat.match=params"]),
    # added before the 8 MB rung started (issue 39): BLT's entropy patching, the strongest
    # rule-based chunker; its threshold is a rate knob, calibrated per domain as the others
    "entropy": ("entropy", []),
    # added before its first cell (2026-12-05): BPE guidance cannot reach r* on the prose mix
    # (its floor on the validation split: results/study-prose/bpe_floor.json), so rl trained and
    # evaluated at BPE's own rate is its partner; the rate is read from the rung's bpe seed-1
    # cell (PARTNER_OF, set_target)
    "rl-bpe-rate": ("rl", HOLD),
    # added before the 8 MB rung started (2026-12-05): the article's head-to-head, a BPE-token LM
    # over a production vocabulary (GPT-NeoX-20B's 50,280 tokens, `rltok data fetch-evals`). Its
    # head alone costs 1.3x the `tiny` U-Net's training FLOPs per byte, so total FLOPs cannot be
    # matched: its body (all but the output heads) is matched and its head comes on top
    "bpe-lm-neox": ("bpe-lm", [f"flat.tokenizer={NEOX}", "flat.match=body_flops"]),
    # added 2026-12-07 (66 cells done, none of the descriptive 8 MB tier run): the v2 ladder's two
    # rows this ladder had left out, so that the 8 MB rung holds every method of the v2 ladder as
    # the issue asks; descriptive, 3 seeds, in the last tier. Two stages FLOP-matched by depth (no
    # skip pass: the inner router's baseline is the outer early exit), and two stages under the
    # paper's rate control only
    "rl-2stage-deep": ("rl", ["model.stages=2", "model.main_layers=6", "boundary.inner_baseline=early", *HOLD]),
    "rl-2stage-penalty": ("rl", ["model.stages=2"]),
    # added 2026-12-08 (78 cells done): the compute dtype is a machine's choice (train.dtype=auto),
    # and the study's machine changes between sessions: every 8 and 32 MB cell so far trained in
    # bf16 (their run summaries), while an AVX2-only machine trains in fp32. rl pinned to fp32,
    # paired by seed with the rung's rl cells, says how much a change of dtype moves a cell
    # (CHECKS); it is not a method
    "rl-fp32": ("rl", [*HOLD, "train.dtype=fp32"]),
}
PARTNER_OF = {"rl-bpe-rate": "bpe"}  # tag -> the cell whose rates it is trained and evaluated at
ABLATIONS: dict[str, tuple[str, list[str]]] = {  # the paper's six, each against rl-penalty
    "abl-gamma1": ("rl", ["boundary.gamma=1"]),
    "abl-no-early-exit": ("rl", ["boundary.reward=neg_ce"]),
    "abl-no-batch-relative": ("rl", ["boundary.baseline=none"]),
    "abl-w8": ("rl", ["boundary.window=8"]),
    "abl-scale16": ("rl", ["boundary.scale=0.0625"]),
    "abl-no-rate-penalty": ("rl", ["boundary.rate_weight=0"]),
}
TOP = ("rl", "rl-penalty", "uniform", "nawrot", "hnet", "bytes", "bpe-lm", "bpe", "rl-bpe-rate")
LADDER = {"2M": TOP, "8M": tuple(VARIANTS) + tuple(ABLATIONS), "32M": (*TOP, "bpe-lm-neox")}
FIVE_SEEDS = ("rl", "uniform", "nawrot", "hnet", "bpe", "rl-bpe-rate")  # at 8 and 32 MB: the close comparisons


def seeds(rung: str, tag: str) -> tuple[int, ...]:
    return (1, 2, 3, 4, 5) if rung != "2M" and tag in FIVE_SEEDS else (1, 2, 3)


def partner_record(rung: str, tag: str) -> dict | None:
    """The seed-1 record of the cell whose rates ``tag`` is matched to (its BPE is fitted on the
    same documents for every seed, so one seed gives its rates), or None if ``tag`` has no partner
    or that cell has not finished."""
    other = PARTNER_OF.get(tag)
    if other is None or not cell_path(rung, other, 1).is_file():
        return None
    return json.loads(cell_path(rung, other, 1).read_text())


def ready(rung: str, tag: str) -> bool:
    return tag not in PARTNER_OF or partner_record(rung, tag) is not None


def train_overrides(rung: str, tag: str) -> list[str]:
    """The tag's --set overrides; a rate partner trains at its partner's late training rate."""
    sets = list(variants()[tag][1])
    if tag == "bpe-lm-neox" and not NEOX.is_file():
        raise RuntimeError(f"{NEOX}: no GPT-NeoX tokenizer (`rltok data fetch-evals` stores it)")
    if tag in PARTNER_OF:
        p = partner_record(rung, tag)
        if p is None:
            raise RuntimeError(f"{tag} at {rung} needs the {PARTNER_OF[tag]} seed-1 cell first")
        sets.append(f"boundary.target_rate={round(float(p['train_rate_late']), 4)}")
    return sets


def set_target(rung: str, tag: str, key: str, cfg) -> float:
    """The rate a cell is matched to on evaluation set ``key``: r* (the run's target), or for a
    rate partner its partner's rate on that same set."""
    p = partner_record(rung, tag) if tag in PARTNER_OF else None
    return float(p[key]["rate"]) if p is not None else float(cfg.boundary.target_rate)


def variants() -> dict[str, tuple[str, list[str]]]:
    return {**VARIANTS, **ABLATIONS}


# The order cells run in (issue 36: "if the machine is too slow for all of it, keep the five seeds
# and drop rows, never the reverse"). On one core a cell takes ~25 min at 8 MB and ~75 min at 32 MB,
# so the rows the pre-registered comparisons 1-8 and 10-13 need come first, at every seed, then the
# 32 MB rung, and last the 8 MB rows that only describe (rl-paper, stride, whitespace, rl-2stage,
# bytes-params) or serve comparison 9 (the six ablations): those are the rows dropped if the study
# has to stop short. Decided on cost and role alone (2026-12-05, 7 of 78 cells at 8 MB done).
CORE_8M = (*TOP, "entropy", "bpe-lm-neox")
DTYPE_CHECK = ("rl-fp32",)
TIERS = (("2M", TOP), ("8M", CORE_8M), ("8M", DTYPE_CHECK), ("32M", LADDER["32M"]),
         ("8M", tuple(t for t in LADDER["8M"] if t not in CORE_8M + DTYPE_CHECK)))


def plan(rungs: list[str]) -> list[tuple[str, str, int]]:
    """Tier by tier (TIERS, the requested rungs only); within a tier seed by seed over its tags, so
    a tier cut short has whole seeds."""
    cells = []
    for rung, tags in TIERS:
        if rung in rungs:
            for seed in range(1, 6):
                cells += [(rung, t, seed) for t in tags if seed in seeds(rung, t)]
    return cells


def cell_path(rung: str, tag: str, seed: int) -> Path:
    return OUT / "cells" / rung / f"{tag}_s{seed}.json"


def run_path(rung: str, tag: str, seed: int) -> Path:
    return RUNS / rung / f"{tag}_s{seed}"


# -- evaluation sets -------------------------------------------------------------------------------

C4_CALIBRATION = 200  # C4 documents 0..199 calibrate, 200..999 are scored
DOCS_DOMAIN_DOCS = 128
# calibration: BOS + the first seq_len bytes of the first CAL_DOCS documents of the set's held-out
# slice, bisected to within CAL_TOL of r* (each bisection step is one evaluation of that slice)
CAL_DOCS, CAL_TOL = 128, 0.004
# a scored set whose rate misses the target by more than this after calibration is read at the target
# from a second scoring (evaluate.score_at_rate); the bar is +-0.01
MATCH_TOL = 0.005


def _wikitext_articles() -> list[bytes]:
    """WikiText-2 test, one document per article (a line `` = Title = `` starts one)."""
    raw = (SHARED / "wikitext2_raw" / "wiki.test.raw").read_bytes()
    docs, cur = [], []
    for line in raw.split(b"\n"):
        s = line.strip()
        if s.startswith(b"= ") and s.endswith(b" =") and not s.startswith(b"= ="):
            if cur and b"".join(cur).strip():
                docs.append(b"\n".join(cur).strip() + b"\n")
            cur = []
        cur.append(line)
    if cur and b"".join(cur).strip():
        docs.append(b"\n".join(cur).strip() + b"\n")
    return docs


def eval_sets(splits) -> dict[str, tuple]:
    """name -> (scored corpus, calibration corpus, what the calibration slice is). Built once per
    process (the english corpus and C4 are read from disk)."""
    from rltok.config import build_config
    from rltok.data import load_splits
    from rltok.data.corpus import Corpus
    from rltok.data.sources import load_corpus

    c4 = load_corpus(str(SHARED / "webtext" / "c4" / "c4_sample.jsonl"))
    c4_docs = [c4.doc_bytes(i) for i in range(len(c4))]
    eng = load_splits(build_config("uniform", "tiny", overrides={"data.source": "english", "data.test_docs": 256}))
    wiki_val = [splits.val.doc_bytes(i) for i in range(len(splits.val))]
    return {
        "test": (splits.test, splits.val, "prose validation split"),
        "c4": (Corpus.from_docs(c4_docs[C4_CALIBRATION:], "c4"), Corpus.from_docs(c4_docs[:C4_CALIBRATION], "c4-cal"),
               f"C4 sample documents 0-{C4_CALIBRATION - 1}"),
        # WikiText-2 is Wikipedia: calibrated on the prose validation split (no WikiText byte)
        "wikitext": (Corpus.from_docs(_wikitext_articles(), "wikitext2-test"), Corpus.from_docs(wiki_val, "prose-val"),
                     "prose validation split"),
        # the first DOCS_DOMAIN_DOCS of the english test split (256 whole documents are 2.1 MB:
        # an hour of evaluation per cell on one thread), each document whole
        "docs_domain": (eng.test.subset(list(range(DOCS_DOMAIN_DOCS))), eng.val, "english validation split"),
    }


# -- one cell ---------------------------------------------------------------------------------------

def train_cell(rung: str, tag: str, seed: int) -> Path:
    from rltok.run import SUMMARY, is_run

    method = variants()[tag][0]
    sets = train_overrides(rung, tag)
    run = run_path(rung, tag, seed)
    if (run / SUMMARY).is_file():
        return run
    cmd = [sys.executable, "-m", "rltok", "train", "--method", method, *COMMON, "--bytes", str(RUNGS[rung]),
           "--seed", str(seed), "--threads", "1", "--no-progress", "--out", str(run)]
    for s in sets:
        cmd += ["--set", s]
    if is_run(run):
        cmd.append("--resume")
    run.parent.mkdir(parents=True, exist_ok=True)
    with open(run.parent / f"{run.name}.log", "a") as log:
        r = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (rc {r.returncode}); see {run.parent / (run.name + '.log')}")
    return run


def offset_trace(run: Path, points: int = 40) -> list[list[float]]:
    """(bytes, rate_offset) of the integral controller over training, thinned to ``points``."""
    from rltok.run import METRICS

    rows = []
    with open(run / METRICS) as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if "rate_offset" in r and "bytes" in r:
                rows.append([int(r["bytes"]), float(r["rate_offset"])])
    step = max(1, len(rows) // points)
    return rows[::step] + ([rows[-1]] if rows and rows[-1] not in rows[::step] else [])


def eval_flops_per_byte(model, cfg, entry: dict) -> float:
    """Training FLOPs per byte at a set's evaluation rates (``entry``: its EvalResult as a dict): a
    two-stage model's deeper levels at their rates on the set too, not at their targets."""
    from rltok.flops import training_flops_per_byte

    return training_flops_per_byte(model, cfg, entry["rate"], entry.get("rates", [])[1:] or None).per_byte


def measure_cell(rung: str, tag: str, seed: int, run: Path) -> dict:
    import rltok
    from rltok.compare import training_record
    from rltok.data import load_splits
    from dataclasses import asdict

    from rltok.evaluate import calibrate_rate, evaluate_corpus, rate_knob, score_at_rate

    model = rltok.load(run)
    cfg = model.run_config
    splits = load_splits(cfg)
    rec = {"rung": rung, "tag": tag, "method": cfg.method, "seed": seed, "overrides": train_overrides(rung, tag),
           "bytes": RUNGS[rung], "corpus": "prose", "train_split_bytes": int(splits.train.total_bytes),
           "weights": model.weights, **training_record(run, model)}
    rec.pop("flops", None)
    rec["flops_per_byte_train"] = rec.pop("flops_per_byte")
    if cfg.method == "rl" and cfg.boundary.rate_integral_gain > 0:
        rec["offset_trace"] = offset_trace(run)
    knob = rate_knob(model)
    kw = dict(dtype=cfg.train.dtype, batch_size=16)
    for name, (scored, cal_docs, cal_what) in eval_sets(splits).items():
        protocols = {name: True, "test512": False} if name == "test" else {name: True}
        for key, whole in protocols.items():  # test512: the paper's protocol, BOS + the first seq_len bytes
            entry: dict = {}
            target = set_target(rung, tag, key, cfg)
            if knob is None:
                r = evaluate_corpus(model, scored, cfg.model.seq_len, whole=whole, **kw)
            else:
                c = calibrate_rate(model, cal_docs, cfg.model.seq_len, target, docs=CAL_DOCS, tol=CAL_TOL, **kw)
                entry["calibration"] = {"on": f"{cal_what}, first {CAL_DOCS} documents, first seq_len bytes",
                                        "value": c.value, "rate": c.rate, "before_value": c.before_value,
                                        "before_rate": c.before_rate, "evaluations": c.evaluations}
                # a set the held-out calibration leaves more than MATCH_TOL off is scored at a second
                # knob value and read at the target (a two-point rate sweep on the scored set)
                r, match = score_at_rate(model, scored, cfg.model.seq_len, target, calibration=cal_docs,
                                         cal_docs=CAL_DOCS, cal_tol=CAL_TOL, tol=MATCH_TOL,
                                         score_kw={"whole": whole}, **kw)
                entry["rate_match"] = asdict(match)
                knob[0].fill_(c.before_value)  # each set calibrates afresh from the trained value
            entry.update(r.to_dict(per_doc=True))
            entry["calibrated"] = knob is not None
            rate = entry.get("rate")
            if rate is not None and rate == rate:
                entry["flops_per_byte"] = eval_flops_per_byte(model, cfg, entry)
            rec[key] = entry
    rec["rate"], rec["bpb"] = rec["test"]["rate"], rec["test"]["bpb"]
    return v2._plain(rec)


def cmd_cell(args) -> int:
    from rltok.checkpoint import write_json_atomic
    from rltok.locks import held
    from rltok.threads import set_threads

    set_threads(1)
    path = cell_path(args.rung, args.tag, args.seed)
    if path.is_file():
        return 0
    folder = run_path(args.rung, args.tag, args.seed)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with held(folder.with_name(folder.name + ".lock"), wait=False) as mine:
        if not mine:
            print(f"cell {args.rung} {args.tag} s{args.seed}: running in another process, skipped", flush=True)
            return 0
        if path.is_file():
            return 0
        t0 = time.time()
        run = train_cell(args.rung, args.tag, args.seed)
        t1 = time.time()
        rec = measure_cell(args.rung, args.tag, args.seed, run)
        rec["measure_seconds"] = round(time.time() - t1, 1)
        v2.keep_run_files(args.rung, args.tag, args.seed, run, OUT)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, rec)
    print(f"cell {args.rung} {args.tag} s{args.seed}: test bpb {rec['bpb']:.4f} rate {rec['rate']:.3f} "
          f"({t1 - t0:.0f} s training, {rec['measure_seconds']:.0f} s measuring)", flush=True)
    return 0


def cell_seconds() -> dict[tuple[str, str], list[float]]:
    out: dict[tuple[str, str], list[float]] = {}
    for f in sorted((OUT / "cells").glob("*/*.json")):
        rec = json.loads(f.read_text())
        if rec.get("train_seconds"):
            out.setdefault((rec["rung"], rec["tag"]), []).append(float(rec["train_seconds"]) +
                                                                 float(rec.get("measure_seconds", 0)))
    return out


def write_leakage() -> dict:
    """results/study-prose/leakage.json: the prose corpus's split statistics and leakage figures
    (rltok.data.prose builds the splits first if needed; two cells then read the cache)."""
    from rltok.checkpoint import write_json_atomic
    from rltok.data.prose import prose_stats

    stats = prose_stats()
    rec = {**stats["leakage"], **{k: stats.get(k) for k in ("splits", "mixture", "dedup", "version", "split_seed")}}
    OUT.mkdir(parents=True, exist_ok=True)
    write_json_atomic(OUT / "leakage.json", rec)
    return rec


def cmd_run(args) -> int:
    from rltok.threads import set_threads

    set_threads(1)
    write_leakage()
    todo = [c for c in plan(args.rungs.split(",")) if not cell_path(*c).is_file()]
    waiting = [c for c in todo if not ready(c[0], c[1])]
    if args.tags:
        todo = [c for c in todo if c[1] in args.tags.split(",")]
        waiting = [c for c in waiting if c[1] in args.tags.split(",")]
    if waiting:  # a rate partner before its partner's cell: it joins once that cell is done
        print(f"{len(waiting)} cells wait for their partner's cell: {waiting}", flush=True)
        todo = [c for c in todo if c not in waiting]
    print(f"{len(todo)} cells to run", flush=True)
    end = time.time() + args.hours * 3600 if args.hours else None
    seconds = cell_seconds()
    lock = threading.Lock()

    def lane():
        while True:
            with lock:
                joined = [c for c in waiting if ready(c[0], c[1])]
                for c in joined:  # their partner's cell has finished: they run next
                    waiting.remove(c)
                todo[:0] = joined
                c = v2.next_cell(todo, seconds, end, time.time(), args.pace, args.partial)
            if c is None:
                return
            rung, tag, seed = c
            rc, out, err, stopped = v2.watch_cell([sys.executable, __file__, "cell", rung, tag, str(seed)],
                                                  run_path(*c), rung, end, args.pace * v2.MEASURE_SECONDS,
                                                  partial=args.partial)
            sys.stdout.write(out)
            if stopped:
                sys.stdout.write(f"cell {rung} {tag} s{seed} stopped before --hours ended (checkpoints kept)\n")
            elif rc != 0:
                sys.stdout.write(f"cell {rung} {tag} s{seed} FAILED: {err.strip().splitlines()[-3:]}\n")
            sys.stdout.flush()

    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(lambda _: lane(), range(args.jobs)))
    if waiting:  # their partner's cell failed or is not in this run: the next run takes them
        print(f"{len(waiting)} cells still wait for their partner's cell: {waiting}", flush=True)
    return 0


def cmd_plan(args) -> int:
    cells = plan(args.rungs.split(","))
    done = [c for c in cells if cell_path(*c).is_file()]
    for c in cells:
        print(("done " if c in done else "todo ") + " ".join(map(str, c)))
    print(f"{len(done)} of {len(cells)} cells done")
    return 0


# -- report -----------------------------------------------------------------------------------------

SETS = ("test", "test512", "c4", "wikitext", "docs_domain")
SET_NAMES = {"test": "prose test (whole)", "test512": "prose test (first 512 bytes)", "c4": "C4 (whole)",
             "wikitext": "WikiText-2 (whole)", "docs_domain": "technical docs (whole)"}
# the pre-registered comparisons (results/study-prose/README.md): (method, reference)
COMPARISONS = [("rl", "uniform"), ("rl", "nawrot"), ("rl", "hnet"), ("rl", "bpe"), ("rl", "rl-penalty"),
               ("rl", "bytes"), ("rl", "bpe-lm"), ("hnet", "nawrot"), ("rl", "entropy"),
               ("rl-bpe-rate", "bpe"), ("rl", "bpe-lm-neox"), ("bpe-lm-neox", "bpe-lm")
               ] + [(a, "rl-penalty") for a in ABLATIONS]
# checks added after the design, reported beside the comparisons and marked so (not pre-registered)
CHECKS = [("rl-fp32", "rl")]


def _no_rate(entry: dict) -> bool:
    """A set's entry for a row without boundaries (a flat LM: no rate, or NaN)."""
    r = entry.get("rate")
    return r is None or r != r


def summarize(cells: list[dict]) -> dict:
    """Per rung and tag: mean ± SE over seeds of bits/byte and rate on each set, FLOPs per byte at
    the training rate and at each set's evaluation rate; per rung, the pre-registered comparisons."""
    import numpy as np

    from rltok.evaluate import standard_error as se

    by: dict = {}
    for c in cells:
        by.setdefault(c["rung"], {}).setdefault(c["tag"], {})[c["seed"]] = c
    out: dict = {}
    for rung, tags in by.items():
        rows = {}
        for tag, cs in tags.items():
            s = {"method": next(iter(cs.values()))["method"], "seeds": sorted(cs)}
            for ev in SETS:
                v = [c[ev]["bpb"] for c in cs.values() if ev in c]
                r = [c[ev]["rate"] for c in cs.values() if ev in c and c[ev].get("rate") is not None]
                s[ev] = {"bpb": float(np.mean(v)) if v else float("nan"), "bpb_se": se(v),
                         "rate": float(np.mean(r)) if r else None,
                         "rate_range": [min(r), max(r)] if r else None,
                         "docs": next(iter(cs.values())).get(ev, {}).get("docs"),
                         # how each seed's rate was matched (evaluate.score_at_rate); cells measured
                         # before it existed were calibrated on the held-out slice only
                         "rate_match": sorted({c[ev].get("rate_match", {}).get("how", "calibrated")
                                               for c in cs.values() if ev in c and c[ev].get("calibrated")})}
                # seeds whose calibrated rate missed its target by more than MATCH_TOL and were read
                # as calibrated: cells measured before score_at_rate existed (no rate_match)
                target = _set_target(tags, tag, ev)
                s[ev]["missed_seeds"] = sorted(k for k, c in cs.items() if ev in c and c[ev].get("calibrated")
                                               and "rate_match" not in c[ev] and target is not None
                                               and abs(c[ev]["rate"] - target) > MATCH_TOL)
                # a row without boundaries (bytes: its rate is NaN) costs per byte what it cost in
                # training, on any text
                f = [c[ev]["flops_per_byte"] if c[ev].get("flops_per_byte") is not None
                     else c.get("flops_per_byte_train") if _no_rate(c[ev]) else None for c in cs.values() if ev in c]
                f = [x for x in f if isinstance(x, (int, float)) and x == x]
                s[ev]["flops_per_byte"] = float(np.mean(f)) if f else None
            for k in ("flops_per_byte_train", "train_rate_late", "train_seconds", "params"):
                v = [c[k] for c in cs.values() if isinstance(c.get(k), (int, float))]
                s[k] = float(np.mean(v)) if v else None
            s["whitespace_recall"] = float(np.mean([c["test"]["whitespace_recall"] for c in cs.values()]))
            rows[tag] = s
        tests = []
        for a, b in COMPARISONS + CHECKS:
            if a not in tags or b not in tags:
                continue
            common = sorted(set(tags[a]) & set(tags[b]))
            for ev in SETS:
                pa = [tags[a][k][ev]["bpb"] for k in common if ev in tags[a][k] and ev in tags[b][k]]
                pb = [tags[b][k][ev]["bpb"] for k in common if ev in tags[a][k] and ev in tags[b][k]]
                t = v2.paired_test(pa, pb)
                # the second figure: each document's difference averaged over the paired seeds, SE
                # over documents (it measures the documents, not the training runs)
                both = [k for k in common if "per_doc_bpb" in tags[a][k].get(ev, {}) and "per_doc_bpb" in tags[b][k].get(ev, {})]
                if len(both) == len(pa):  # every seed the t-test pairs
                    t.update(v2.per_document_delta([tags[a][k][ev]["per_doc_bpb"] for k in both],
                                                   [tags[b][k][ev]["per_doc_bpb"] for k in both]))
                # the test pairs seeds both rows plan (rl's five against rl-penalty's three: three
                # pairs); only once every one of them is in is "resolved" a claim
                planned = sorted(set(seeds(rung, a)) & set(seeds(rung, b)))
                t.update(method=a, reference=b, set=ev, seeds=common, planned_seeds=planned,
                         preregistered=(a, b) in COMPARISONS,
                         resolved=t["p"] is not None and t["p"] < 0.05,
                         complete=set(planned) <= set(common))
                tests.append(t)
        out[rung] = {"rows": rows, "comparisons": tests}
    return out


def _set_target(tags: dict, tag: str, ev: str) -> float | None:
    """The rate a cell of ``tag`` is matched to on set ``ev``: its partner's seed-1 rate there for
    a rate partner (None until that cell exists), r* otherwise."""
    other = PARTNER_OF.get(tag)
    if other is None:
        return v2.TARGET_RATE
    c = tags.get(other, {}).get(1, {}).get(ev)
    return None if c is None or c.get("rate") is None else float(c["rate"])


def _fmt(x, nd=4) -> str:
    return "—" if x is None or x != x else f"{x:.{nd}f}"


def _matched(entry: dict) -> str:
    """A mark for a rate read from more than one scoring (ⁱ interpolated, ᵉ extrapolated), or one
    that missed its target and was read as calibrated (ᵐ)."""
    how = entry.get("rate_match") or []
    return (("ⁱ" if "interpolated" in how else "") + ("ᵉ" if "extrapolated" in how else "")
            + ("ᵐ" if entry.get("missed_seeds") else ""))


def _verdict(t: dict) -> str:
    """yes / no once both rows have every seed the test pairs; until then, pending with the seeds in."""
    if t.get("complete", True):
        return "yes" if t["resolved"] else "no"
    return f"pending ({t['n']} of {len(t['planned_seeds'])} seeds)"


def tables(summary: dict) -> str:
    lines = []
    for rung in sorted(summary, key=RUNGS.get):
        rows = summary[rung]["rows"]
        lines += [f"### {rung} bytes per run", "",
                  "| method | seeds | " + " | ".join(f"{SET_NAMES[e]} bpb (rate)" for e in SETS)
                  + " | train FLOPs/byte | FLOPs/byte at the test rate | ws recall |", "|" + "---|" * (len(SETS) + 5)]
        for tag in [t for t in list(VARIANTS) + list(ABLATIONS) if t in rows]:
            s = rows[tag]
            cells = [f"{_fmt(s[e]['bpb'])} ± {_fmt(s[e]['bpb_se'])} ({_fmt(s[e]['rate'], 3)}{_matched(s[e])})" for e in SETS]
            lines.append(f"| {tag} | {len(s['seeds'])} | " + " | ".join(cells)
                         + f" | {_fmt((s['flops_per_byte_train'] or float('nan')) / 1e6, 2)}M"
                         + f" | {_fmt((s['test'].get('flops_per_byte') or float('nan')) / 1e6, 2)}M | {_fmt(s['whitespace_recall'], 3)} |")
        lines += ["", f"#### {rung}: pre-registered comparisons (paired over seeds, two-sided t, n − 1 df)", "",
                  "| comparison | set | seeds | Δ bpb | SE | 95% CI | p | resolved | SE over documents (docs) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for t in summary[rung]["comparisons"]:
            ci = f"[{t['ci95'][0]:+.4f}, {t['ci95'][1]:+.4f}]" if t["ci95"] else "—"
            p = "—" if t["p"] is None else f"{t['p']:.3g}"
            docs = f"{_fmt(t['se_docs'])} ({t['docs']})" if "se_docs" in t else "—"
            check = "" if t.get("preregistered", True) else " (check, added later)"
            lines.append(f"| {t['method']} − {t['reference']}{check} | {t['set']} | {t['n']} | {t['mean']:+.4f} | {_fmt(t['se'])} "
                         f"| {ci} | {p} | {_verdict(t)} | {docs} |")
        lines.append("")
    lines.append("bpb: mean over seeds ± SE over seeds; rate: mean boundaries per byte on that set (routers with a "
                 "knob calibrated to r* = 0.2 on a held-out slice of the set's domain first; ⁱ: for at least one "
                 "seed the calibrated rate missed by more than 0.005 and the set was read at the target between "
                 "two scorings, ᵉ: the same from two points on one side; ᵐ: for at least one seed, measured "
                 "before that reading existed, the calibrated rate missed by more than 0.005 and was read as "
                 "it stands). rl-bpe-rate is matched to bpe's rate on each set instead. A comparison is "
                 "resolved only at p < 0.05, and is pending until both rows have every seed it pairs (the seeds both plan). "
                 "SE over documents: each document's Δ averaged over the paired seeds, SE over the documents; "
                 "a second figure that measures the documents, not the training runs, and decides nothing.")
    return "\n".join(lines)


# README.md's block of prose-study results, rewritten by `report` between these lines
README_START = "<!-- prose-study summary: generated by `python tools/study_prose.py report`; edits here are overwritten -->"
README_END = "<!-- /prose-study summary -->"
README_SETS = ("test", "c4")  # in domain, and web text never trained on


def complete_rung(summary: dict) -> str | None:
    """The largest rung whose core rows (the pre-registered comparisons' methods, ablations
    aside) all have every planned seed, or None."""
    done = None
    for rung in sorted(summary, key=RUNGS.get):
        rows = summary[rung]["rows"]
        core = [t for t in LADDER[rung] if t in CORE_8M]
        if all(t in rows and set(seeds(rung, t)) <= set(rows[t]["seeds"]) for t in core):
            done = rung
    return done


def readme_summary(summary: dict) -> str:
    """The README's table: the pre-registered comparisons of the largest complete rung (ablations
    aside) on the prose test split and on C4, each Δ mean ± SE over seeds with its paired p."""
    rung = complete_rung(summary)
    if rung is None:
        return "The prose study has no complete rung yet."
    tests = {(t["method"], t["reference"], t["set"]): t for t in summary[rung]["comparisons"]}
    pairs = [(a, b) for a, b in COMPARISONS if b not in ABLATIONS and a not in ABLATIONS and (a, b, "test") in tests]
    names = {"test": "prose test (whole documents)", "c4": "C4 (never trained on)"}
    lines = [f"Prose study, {rung} bytes per run (the largest rung with every planned seed; "
             f"[tables](results/study-prose/tables.md)). Δ bits/byte = first − second, mean ± SE over the "
             "seeds both have (negative: the first is better); p: paired t over seeds, n − 1 df.", "",
             "| comparison | seeds | " + " | ".join(f"{names[e]} | p" for e in README_SETS) + " |",
             "|---|---|" + "---|---|" * len(README_SETS)]
    for a, b in pairs:
        row = [tests.get((a, b, e)) for e in README_SETS]
        cells = [("—", "—") if t is None else (f"{t['mean']:+.3f} ± {_fmt(t['se'], 3)}",
                                               "—" if t["p"] is None else f"{t['p']:.2g}") for t in row]
        lines.append(f"| {a} − {b} | {row[0]['n']} | " + " | ".join(f"{d} | {q}" for d, q in cells) + " |")
    resolved = [f"{t['method']} − {t['reference']} ({t['set']})" for (a, b, e), t in tests.items()
                if (a, b) in pairs and e in README_SETS and t["resolved"]]
    lines += ["", f"Resolved at p < 0.05: {', '.join(resolved) or 'none'}."]
    unmatched = [n for n in (_unmatched(summary[rung]["rows"], a, b) for a, b in pairs) if n]
    if unmatched:
        lines += ["", "Not matched (rates: boundaries or tokens per byte; FLOPs: per training byte): "
                  + "; ".join(unmatched) + "."]
    return "\n".join(lines)


def _unmatched(rows: dict, a: str, b: str) -> str | None:
    """What a comparison does not match, read from the rows: the rate on a README set where the two
    differ by more than 0.01, training FLOPs per byte where they differ by more than 5%."""
    notes = []
    for e in README_SETS:
        ra, rb = rows[a][e].get("rate"), rows[b][e].get("rate")
        if ra is not None and rb is not None and abs(ra - rb) > 0.01:
            notes.append(f"rate on {e} {ra:.3f} vs {rb:.3f}")
    fa, fb = rows[a].get("flops_per_byte_train"), rows[b].get("flops_per_byte_train")
    if fa and fb and abs(fa / fb - 1) > 0.05:
        notes.append(f"training FLOPs/byte {fa / 1e6:.2f}M vs {fb / 1e6:.2f}M")
    return f"{a} − {b}: {', '.join(notes)}" if notes else None


def write_readme_block(readme: Path, block: str) -> bool:
    """Replace the text between README_START and README_END; False (nothing written) if either is missing."""
    if not readme.is_file():
        return False
    text = readme.read_text()
    i, j = text.find(README_START), text.find(README_END)
    if i < 0 or j < i:
        return False
    readme.write_text(text[: i + len(README_START)] + "\n" + block + "\n" + text[j:])
    return True


# rows whose Δ vs uniform is an order of magnitude beyond the byte models' (a BPE-token LM reads
# ~0.6-0.9 bits/byte lower): drawn as arrows at the Δ panel's edge with their value, so that the
# byte models' differences of a few hundredths stay readable
DELTA_OFF_SCALE = ("bpe-lm", "bpe-lm-neox")


def _delta_vs_uniform(by: dict, rungs: list[str], tag: str) -> list[tuple]:
    """(bytes, mean, SE over seeds, seeds, rung) of tag − uniform on the test split, paired by seed
    (by: (rung, tag) -> seed -> test bits/byte)."""
    import numpy as np
    pts = []
    for r in rungs:
        a, u = by.get((r, tag), {}), by.get((r, "uniform"), {})
        k = sorted(set(a) & set(u))
        if k:
            d = np.array([a[s] - u[s] for s in k])
            pts.append((RUNGS[r], float(d.mean()), float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else 0.0, len(k), r))
    return pts


def plot(summary: dict, cells: list[dict], out: Path):
    """Three panels: test bits/byte vs training bytes and vs training FLOPs, and each row's Δ vs
    uniform (paired by seed). Returns the figure (closed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rungs = sorted(summary, key=RUNGS.get)
    tags = [t for t in VARIANTS if t not in DTYPE_CHECK and any(t in summary[r]["rows"] for r in rungs)]
    fig, axes = plt.subplots(1, 3, figsize=(18, 6.2))
    by: dict = {}
    for c in cells:
        by.setdefault((c["rung"], c["tag"]), {})[c["seed"]] = c["test"]["bpb"]
    off = []
    for i, tag in enumerate(tags):
        col = plt.cm.tab20(i % 20)
        rs = [r for r in rungs if tag in summary[r]["rows"]]
        rows = [summary[r]["rows"][tag] for r in rs]
        axes[0].errorbar([RUNGS[r] for r in rs], [s["test"]["bpb"] for s in rows],
                         yerr=np.nan_to_num([s["test"]["bpb_se"] for s in rows]), marker="o", capsize=2, label=tag, color=col)
        fl = [(s["flops_per_byte_train"] or np.nan) * RUNGS[r] for s, r in zip(rows, rs)]
        axes[1].errorbar(fl, [s["test"]["bpb"] for s in rows], yerr=np.nan_to_num([s["test"]["bpb_se"] for s in rows]),
                         marker="o", capsize=2, label=tag, color=col)
        pts = [] if tag == "uniform" else _delta_vs_uniform(by, rungs, tag)
        if not pts:
            continue
        if tag in DELTA_OFF_SCALE:
            off.append((tag, col, pts))
            continue
        # rows side by side at each budget (a small horizontal dodge), or their error bars overlap
        x = [p[0] * 2 ** (0.025 * (i - len(tags) / 2)) for p in pts]
        at = f" (at {PARTNER_OF[tag]}'s rate)" if tag in PARTNER_OF else " (at its tokens' rate)" if tag == "bpe" else ""
        axes[2].errorbar(x, [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o" if tag == "rl" else "s",
                         capsize=2, label=f"{tag} − uniform{at}", color=col, lw=2.2 if tag == "rl" else 1.2)
    for a in axes:
        a.set_xscale("log", base=2)
        a.grid(alpha=0.3)
    axes[2].axhline(0, color="#333", lw=0.8)
    lo, hi = axes[2].get_ylim()
    for tag, col, pts in off:
        for x, m, se, n, rung in pts:
            if lo <= m <= hi:
                axes[2].errorbar([x], [m], yerr=[se], marker="*", color=col, capsize=2, label=f"{tag} − uniform")
                continue
            edge = lo + 0.04 * (hi - lo) if m < lo else hi - 0.04 * (hi - lo)
            axes[2].plot([x], [edge], "v" if m < lo else "^", color=col, markersize=9,
                         label=f"{tag} − uniform at {rung}: {m:+.3f} ± {se:.3f} ({n} seeds), off scale")
    axes[2].set_ylim(lo, hi)
    axes[0].set_xlabel("training bytes per run")
    axes[1].set_xlabel("training FLOPs per run (at the training rate)")
    axes[2].set_xlabel("training bytes per run")
    axes[0].set_ylabel("prose test bits/byte (whole documents)")
    axes[1].set_ylabel("prose test bits/byte (whole documents)")
    axes[2].set_ylabel("Δ bits/byte vs uniform (same seed, same documents)")
    # below the panels: inside, a dozen rows' legend covers the points
    axes[0].legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.13))
    axes[2].legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.13))
    fig.suptitle("prose study: mean ± SE over seeds; routers with a rate knob calibrated to r* on each set's domain")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return fig


def corpus_lines(leak: dict) -> str:
    """What the study trains and scores on, read from leakage.json: the training mixture, each
    split's documents by source, and the test split's 64-byte segments found in training."""
    if not leak.get("splits"):
        return ""
    sp, mix = leak["splits"], leak.get("mixture", {})
    def docs(split):
        return ", ".join(f"{k} {v['docs']:,} documents ({v['bytes'] / 1e6:.1f} MB)" for k, v in sp[split].items() if k != "total")
    return (f"Corpus: prose (`--data prose`). Training split by bytes: "
            + ", ".join(f"{k} {v:.1%}" for k, v in mix.items()) + f". Test split: {docs('test')}; "
            f"validation: {docs('val')}. Test 64-byte segments found verbatim in training: "
            f"{leak['test_segments_in_train']:.3%}.\n\n")


def dtype_lines(cells: list[dict], out: Path) -> str:
    """Per rung, how many cells trained in each compute dtype (``train.dtype=auto`` picks bf16 or
    fp32 by the CPU, rltok/precision.py), read from each cell's committed run summary (kept by
    the cell under OUT/runs, ``study.kept_run_dir``)."""
    from collections import Counter

    from rltok.run import SUMMARY

    counts: dict[str, Counter] = {}
    for c in cells:
        f = v2.kept_run_dir(c["rung"], c["tag"], c["seed"], out) / SUMMARY
        dtype = (json.loads(f.read_text()).get("dtype") if f.is_file() else None) or "no summary"
        counts.setdefault(c["rung"], Counter())[dtype] += 1
    if not counts:
        return ""
    lines = [f"{rung}: " + ", ".join(f"{n} {d}" for d, n in sorted(counts[rung].items()))
             for rung in sorted(counts, key=RUNGS.get)]
    return ("Compute dtype per cell (each run's summary.json under runs/; bf16 or fp32 as `train.dtype=auto` "
            "chose on the cell's CPU, or as pinned): " + "; ".join(lines) + ".\n\n")


def results_json(leak: dict, summary: dict, cells: list[dict]) -> str:
    """The published record, strict JSON: the cell records keep Python's NaN where a value does
    not exist (a byte model's rate), results.json says null."""
    from rltok.checkpoint import finite_or_null
    return json.dumps(finite_or_null({"leakage": leak, "summary": summary, "cells": cells}), allow_nan=False) + "\n"


def cmd_report(args) -> int:
    cells = [json.loads(p.read_text()) for p in sorted((OUT / "cells").glob("*/*.json"))]
    if not cells:
        print(f"{OUT / 'cells'}: no finished cells", file=sys.stderr)
        return 2
    summary = summarize(cells)
    leak = json.loads((OUT / "leakage.json").read_text()) if (OUT / "leakage.json").is_file() else {}
    (OUT / "results.json").write_text(results_json(leak, summary, cells))
    (OUT / "tables.md").write_text("# Prose study tables (generated by tools/study_prose.py report)\n\n"
                                   + corpus_lines(leak) + dtype_lines(cells, OUT) + tables(summary) + "\n")
    plot(summary, cells, OUT / "ladder.png")
    # the README of the checkout these results belong to (OUT is its results/study-prose)
    readme = " and README.md's summary" if write_readme_block(OUT.parent.parent / "README.md", readme_summary(summary)) else ""
    print(f"wrote {OUT}/results.json, tables.md, ladder.png{readme} ({len(cells)} cells)")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, fn in (("run", cmd_run), ("plan", cmd_plan)):
        q = sub.add_parser(name)
        q.add_argument("--rungs", default="2M")
        q.add_argument("--jobs", type=int, default=2)
        q.add_argument("--tags", default="", help="only these variants, comma-separated")
        q.add_argument("--hours", type=float, default=0.0, help="start only cells expected to finish in time")
        q.add_argument("--pace", type=float, default=1.0)
        q.add_argument("--partial", action="store_true", help="with --hours: stop the last cell with a checkpoint")
        q.set_defaults(func=fn)
    c = sub.add_parser("cell")
    c.add_argument("rung", choices=list(RUNGS))
    c.add_argument("tag", choices=list(variants()))
    c.add_argument("seed", type=int)
    c.set_defaults(func=cmd_cell)
    sub.add_parser("report").set_defaults(func=cmd_report)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
