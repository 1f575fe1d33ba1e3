"""Issue 16: the cost of each language under learned chunks, BPE and GPT-NeoX's BPE.

    python tools/multilingual_study.py measure runs/multilingual   # per run, resumable
    python tools/multilingual_study.py flores-tokenizers [RUNS]    # GPT-NeoX's BPE (and RUNS' own) on FLORES-200
    python tools/multilingual_study.py bpe-sweep RUNS              # RUNS' same-data BPE at other vocabulary sizes
    python tools/multilingual_study.py report                      # results.json, tables, chart

``measure`` scores every finished run of ``results/multilingual/run.sh`` on three held-out sets,
per language, and writes results/multilingual/measure/RUN.json (a run already measured is skipped):

* ``test``: the multilingual corpus's test split (256 documents no run trains on; not parallel),
  at most MAX_TEST_BYTES per language, every byte scored (``rltok eval --whole``): bpb, bytes per
  chunk, chunks per word;
* ``reference``: the held-out chapters of the Debian Reference (``multilingual-heldout``, 11
  languages, line-aligned but partly left in English: fr 36%, pt 24%, ja 17%, es 12% of the bytes);
  ``reference_translated``: the same without any line some language left in English;
* ``flores``: FLORES-200 devtest, truly parallel (204 languages; the rate knob calibrated on
  sentences 0-505 of the training languages, every language scored on 506-1011);
* ``udhr``: the UDHR in 37 languages (parallel; 20 of them are training languages).

On the two parallel sets each language's chunks and bits are also given relative to English's for
the same content. The tokenizers (the BPE that BPE guidance uses, fitted on the same training text
at the same mean rate, and GPT-NeoX-20B's) are measured on the same texts once.
``report`` gathers the measurements into results/multilingual/results.json, the tables of the
README (results/multilingual/tables.md) and the chart (cost_vs_english.png).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "results" / "multilingual"
UDHR = ROOT.parent / "shared" / "data" / "multilingual" / "udhr"
FLORES = ROOT.parent / "shared" / "data" / "multilingual" / "flores200_devtest"
MAX_TEST_BYTES = 32_000
# UDHR file key -> language of the training corpus (the other UDHR languages are unseen)
UDHR_TRAINED = {"ces": "cs", "cmn_hans": "zh-cn", "cmn_hant": "zh-tw", "deu_1996": "de", "ell_monotonic": "el",
                "eng": "en", "fin": "fi", "fra": "fr", "hun": "hu", "ind": "id", "ita": "it", "jpn": "ja",
                "nld": "nl", "pol": "pl", "por_BR": "pt-br", "rus": "ru", "spa": "es", "tur": "tr",
                "ukr": "uk", "vie": "vi"}
UNSPACED = {"ja", "zh-cn", "zh-tw", "jpn", "cmn_hans", "cmn_hant", "yue", "tha", "khm", "mya"}
METHOD_ORDER = ["rl", "rl-doc", "rl-content", "entropy", "bpe", "uniform", "hnet"]


def _neox():
    from rltok.bpe import load_tokenizer

    p = Path.home() / ".cache" / "rltok" / "evals" / "gpt-neox-20b.json"
    if not p.is_file():
        sys.exit(f"{p}: missing; run `rltok data fetch-evals` (it stores GPT-NeoX's BPE there)")
    tok = load_tokenizer(p)
    tok.normalizer = None  # tokens must cover the bytes as they are
    return tok


def _same_data_bpe(runs: Path):
    from rltok.bpe import load_tokenizer

    p = runs / "bpe_s42" / "tokenizer.json"
    if not p.is_file():
        sys.exit(f"{p}: missing; the BPE-guidance run fits the BPE on the training text")
    return load_tokenizer(p), json.loads((runs / "bpe_s42" / "tokenizer.info.json").read_text())


def _parallel_sets():
    from rltok.analysis import Translation, read_udhr
    from rltok.data import multilingual
    from rltok.data.languages import script_of

    by_lang: dict[str, list[str]] = {}
    for lang, d in zip(multilingual.languages("multilingual-heldout"), multilingual.docs("multilingual-heldout")):
        by_lang.setdefault(lang, []).append(d.decode("utf-8"))
    ref = [Translation(key=lang, name=lang, script=script_of(lang), paragraphs=paras) for lang, paras in by_lang.items()]
    return {"reference": (ref, "en"), "udhr": (read_udhr(UDHR), "eng"),
            "reference_translated": (_reference_translated(by_lang)[0], "en")}


def _reference_translated(by_lang: dict[str, list[str]] | None = None):
    """The Debian Reference's held-out chapters with every line some language left in English
    removed from all languages (issue 39; rltok.analysis.translated_only), and what was removed."""
    from rltok.analysis import translated_only
    from rltok.data import multilingual
    from rltok.data.languages import script_of

    if by_lang is None:
        by_lang = {}
        for lang, d in zip(multilingual.languages("multilingual-heldout"), multilingual.docs("multilingual-heldout")):
            by_lang.setdefault(lang, []).append(d.decode("utf-8"))
    texts, info = translated_only(by_lang, "en")
    for t in texts:
        t.script = script_of(t.key)
    return texts, info


def add_flops(rows: list[dict], model, reference: str) -> list[dict]:
    """Each cross_language row's training FLOPs per byte at the rate the model ran at on that
    text (``flops_per_byte:m``) and the FLOPs for the same content relative to the reference
    language's (``flops_rel:m``: FLOPs per byte x bytes)."""
    from rltok.flops import training_flops_per_byte

    cfg = model.run_config
    for r in rows:
        r["flops_per_byte:m"] = training_flops_per_byte(model, cfg, r["chunks:m"] / max(1, r["bytes"])).per_byte
    ref = next((r for r in rows if r["lang"] == reference), None)
    if ref is not None:
        for r in rows:
            r["flops_rel:m"] = r["flops_per_byte:m"] * r["bytes"] / (ref["flops_per_byte:m"] * ref["bytes"])
    return rows


def _test_by_language(cfg):
    """The test split's documents per language, at most MAX_TEST_BYTES each (whole documents)."""
    from rltok.data.corpus import split_corpus
    from rltok.data.languages import corpus_languages, source_languages
    from rltok.data.sources import load_corpus

    test = split_corpus(load_corpus(cfg.data.source, cfg.data), cfg.data).test
    langs = corpus_languages(test, source_languages(cfg.data.source, cfg.data))
    out: dict[str, list[int]] = {}
    size: dict[str, int] = {}
    for i, lang in enumerate(langs):
        if size.get(lang, 0) < MAX_TEST_BYTES:
            out.setdefault(lang, []).append(i)
            size[lang] = size.get(lang, 0) + int(test.lengths[i])
    return test, out


def _words(texts) -> int:
    return sum(len(t.split()) for t in texts)


def measure_run(run: Path, dtype: str = "bf16") -> dict:
    import rltok
    from rltok.analysis import cross_language
    from rltok.evaluate import evaluate_corpus

    model = rltok.load(run)
    cfg = model.run_config
    test, groups = _test_by_language(cfg)
    rows = {}
    for lang, idx in sorted(groups.items()):
        sub = test.subset(np.array(idx))
        r = evaluate_corpus(model, sub, cfg.model.seq_len, whole=True, dtype=dtype, batch_size=16)
        texts = [sub.doc_bytes(i).decode("utf-8", "replace") for i in range(len(sub))]
        chunks = r.rate * r.bytes
        rows[lang] = {"docs": len(idx), "bytes": r.bytes, "bpb": r.corpus_bpb, "rate": r.rate,
                      "bytes_per_chunk": 1 / r.rate if r.rate > 0 else float("nan"),
                      "chunks_per_word": None if lang in UNSPACED else chunks / max(1, _words(texts))}
    out = {"run": run.name, "method": cfg.method, "seed": cfg.train.seed, "weights": model.weights,
           "rate_scope": getattr(cfg.boundary, "rate_scope", "batch"), "test": rows}
    for name, (texts, reference) in _parallel_sets().items():
        out[name] = add_flops(cross_language(texts, {"m": model}, {}, reference=reference, dtype=dtype, seed=0,
                                             mode="sample", batch_size=16), model, reference)
    if FLORES.is_dir():
        out["flores_calibration"], out["flores"] = measure_flores(model, dtype)
    return out


def measure_flores(model, dtype: str = "bf16") -> tuple[dict | None, list[dict]]:
    """FLORES-200 (issue 39): the model's rate knob, where it has one, calibrated to its
    boundary.target_rate on the calibration half (sentences 0-505) of the training languages'
    files, then every language's scoring half (506-1011) measured against English's."""
    from rltok.analysis import cross_language, read_flores
    from rltok.data.corpus import Corpus
    from rltok.data.languages import FLORES_OF
    from rltok.evaluate import calibrate_rate, rate_knob

    cal = None
    if rate_knob(model) is not None:
        trained = sorted(set(FLORES_OF.values()))
        docs = [p.encode("utf-8") for t in read_flores(FLORES, "calibrate", keys=trained) for p in t.paragraphs]
        c = calibrate_rate(model, Corpus.from_docs(docs, "flores-calibrate"), model.run_config.model.seq_len,
                           model.run_config.boundary.target_rate, docs=None, tol=0.002, whole=True, dtype=dtype,
                           batch_size=16)
        cal = {"target": model.run_config.boundary.target_rate, "rate": c.rate, "knob": c.value,
               "knob_before": c.before_value, "rate_before": c.before_rate, "docs": len(docs)}
    return cal, add_flops(cross_language(read_flores(FLORES, "score"), {"m": model}, {}, reference="eng_Latn",
                                         dtype=dtype, seed=0, mode="sample", batch_size=16), model, "eng_Latn")


def measure_flores_tokenizers(runs: Path | None) -> dict:
    """GPT-NeoX's BPE, and the BPE that BPE guidance fitted on the same training text where
    RUNS/bpe_s42 holds it, on FLORES's scoring half."""
    from rltok.analysis import cross_language, read_flores

    toks = {"gpt-neox": _neox()}
    if runs is not None and (runs / "bpe_s42" / "tokenizer.json").is_file():
        toks["bpe-same-data"] = _same_data_bpe(runs)[0]
    return {"flores": cross_language(read_flores(FLORES, "score"), {}, toks, reference="eng_Latn"),
            "reference_translated": cross_language(_reference_translated()[0], {}, toks, reference="en"),
            "tokenizers": sorted(toks), "half": "score (sentences 506-1011)", "group": 4}


def measure_bpe_sweep(runs: Path, vocabs: list[int]) -> dict:
    """The same-data BPE at other vocabulary sizes (issue 39): fitted as BPE guidance fits its BPE
    (RUNS/bpe_s42's training split, the same documents and the same 90% of them), measured on
    FLORES's halves. The guidance's BPE is fitted to r* on training text and runs at ~0.26 tokens
    per byte on FLORES, where the policies are calibrated to r*: how its CV of tokens per content
    moves with its rate says how much of the ratio is rate, not method."""
    import rltok
    from rltok.analysis import cross_language, read_flores
    from rltok.bpe import fit_docs, holdout_split, train_bpe
    from rltok.data import load_splits

    guidance, info = _same_data_bpe(runs)
    cfg = rltok.load(runs / "bpe_s42").run_config
    docs = fit_docs(load_splits(cfg).train, info["fit_bytes"])
    if len(docs) != info["fit_docs"]:
        sys.exit(f"{runs / 'bpe_s42'}: its BPE was fitted on {info['fit_docs']} documents, the split gives "
                 f"{len(docs)}: not the same training text")
    fit = holdout_split(docs)[0]  # fit_bpe_to_rate's fitting part
    trained = _flores_trained()
    score, cal = read_flores(FLORES, "score"), read_flores(FLORES, "calibrate", keys=sorted(trained))
    points, reproduced = [], None
    for v in sorted(set(vocabs) | {info["vocab_size"]}):  # the guidance's own size: the check that this is its BPE
        tok = train_bpe(fit, v)
        if any(q["vocab_size"] == tok.get_vocab_size() for q in points):
            continue  # the trainer ran out of merges below v: a larger request gives the same BPE
        rows = cross_language(score, {}, {"b": tok}, reference="eng_Latn")
        if v == info["vocab_size"]:
            same = cross_language(score, {}, {"g": guidance}, reference="eng_Latn")
            reproduced = all(r["tokens:b"] == g["tokens:g"] for r, g in zip(rows, same))
            if not reproduced:
                print(f"bpe-sweep: refitted at {v:,}, the BPE does not give the guidance BPE's token counts on "
                      "FLORES: the sweep is not that BPE's family", file=sys.stderr)
        crow = cross_language(cal, {}, {"b": tok}, reference="eng_Latn")
        tr = [r for r in rows if r["lang"] in trained]
        points.append({"vocab_requested": v, "vocab_size": tok.get_vocab_size(),
                       "tokens_per_byte_calibration": sum(r["tokens:b"] for r in crow) / sum(r["bytes"] for r in crow),
                       "tokens_per_byte_trained": sum(r["tokens:b"] for r in tr) / sum(r["bytes"] for r in tr),
                       "cv_tokens_per_content": _spread(_parallel_costs(rows, "tokens_rel:b", trained).values()),
                       "cv_tokens_per_content_all": _spread(_parallel_costs(rows, "tokens_rel:b").values()),
                       "cv_bytes_per_token": _spread(_parallel_costs(rows, "bytes_per_token:b", trained).values())})
        p = points[-1]
        print(f"vocab {p['vocab_size']}: {p['tokens_per_byte_trained']:.3f} tokens/byte on FLORES (training "
              f"languages), CV tokens/content {p['cv_tokens_per_content']['cv']:.3f}", file=sys.stderr)
    return {"fitted_on": {"run": "bpe_s42", "fit_docs": len(fit), "fit_bytes": sum(map(len, fit))},
            "reproduces_guidance_bpe": reproduced,
            "half": "score (sentences 506-1011); tokens_per_byte_calibration on 0-505", "points": points}


def cmd_bpe_sweep(args) -> int:
    dest = OUT / args.into
    dest.mkdir(parents=True, exist_ok=True)
    res = measure_bpe_sweep(Path(args.runs), [int(v) for v in args.vocab.split(",")])
    (dest / "_flores_bpe_sweep.json").write_text(json.dumps(res, indent=1))
    print(f"measured {len(res['points'])} vocabulary sizes -> {dest / '_flores_bpe_sweep.json'}")
    return 0


def measure_tokenizers(runs: Path) -> dict:
    from rltok.analysis import cross_language
    from rltok.bpe import token_lengths

    bpe, info = _same_data_bpe(runs)
    toks = {"bpe-same-data": bpe, "gpt-neox": _neox()}
    import rltok

    cfg = rltok.load(runs / "bpe_s42").run_config
    test, groups = _test_by_language(cfg)
    rows = {}
    for lang, idx in sorted(groups.items()):
        docs = [test.doc_bytes(i) for i in idx]
        n = sum(map(len, docs))
        words = _words(d.decode("utf-8", "replace") for d in docs)
        rows[lang] = {}
        for name, tok in toks.items():
            k = sum(len(token_lengths(tok, d)) for d in docs)
            rows[lang][name] = {"bytes_per_token": n / k, "tokens_per_word": None if lang in UNSPACED else k / max(1, words)}
    out = {"bpe-same-data": info, "test": rows}
    for name, (texts, reference) in _parallel_sets().items():
        out[name] = cross_language(texts, {}, toks, reference=reference)
    return out


def cmd_flores_tokenizers(args) -> int:
    dest = OUT / args.into
    dest.mkdir(parents=True, exist_ok=True)
    res = measure_flores_tokenizers(Path(args.runs) if args.runs else None)
    (dest / "_flores_tokenizers.json").write_text(json.dumps(res, indent=1))
    print(f"measured {', '.join(res['tokenizers'])} on FLORES-200 -> {dest / '_flores_tokenizers.json'}")
    return 0


def cmd_measure(args) -> int:
    from rltok.threads import set_threads

    set_threads(args.threads)
    runs = Path(args.runs)
    dest = OUT / args.into
    dest.mkdir(parents=True, exist_ok=True)
    if args.shard.startswith("0/") and not (dest / "_tokenizers.json").is_file() \
            and (runs / "bpe_s42" / "tokenizer.json").is_file():
        (dest / "_tokenizers.json").write_text(json.dumps(measure_tokenizers(runs), indent=1))
        print("measured the tokenizers", flush=True)
    k, n = map(int, args.shard.split("/"))
    for i, run in enumerate(sorted(p for p in runs.iterdir() if p.is_dir())):
        if args.only and run.name not in args.only.split(","):
            continue
        if i % n != k or not (run / "summary.json").is_file() or (dest / f"{run.name}.json").is_file():
            continue
        res = measure_run(run)
        tmp = dest / f"{run.name}.json.tmp"  # whole or not at all: a reader never sees half a record
        tmp.write_text(json.dumps(res, indent=1))
        tmp.replace(dest / f"{run.name}.json")
        print(f"measured {run.name}", flush=True)
    return 0


def supplement_record(m: dict, run: Path, dtype: str = "bf16") -> list[str]:
    """What a record measured before issue 39's last additions lacks, added in place: the
    Debian Reference without its untranslated lines (scored at the trained rate knob, as the
    other parallel sets are) and the FLOPs of every parallel row (from its rate; nothing
    scored again). Returns the names of what was added."""
    import rltok
    from rltok.analysis import cross_language

    model = rltok.load(run)
    if m.get("weights") != model.weights:  # the 4 and 8 MB studies' runs share names
        raise SystemExit(f"{run}: its weights {model.weights} are not the ones the record {m['run']} measured "
                         f"({m.get('weights')}); wrong runs folder?")
    added = []
    if "reference_translated" not in m:
        texts, reference = _parallel_sets()["reference_translated"]
        m["reference_translated"] = add_flops(cross_language(texts, {"m": model}, {}, reference=reference, dtype=dtype,
                                                             seed=0, mode="sample", batch_size=16), model, reference)
        added.append("reference_translated")
    for name, reference in (("reference", "en"), ("udhr", "eng"), ("flores", "eng_Latn")):
        if m.get(name) and "flops_per_byte:m" not in m[name][0]:
            add_flops(m[name], model, reference)
            added.append(f"{name} FLOPs")
    return added


def cmd_supplement(args) -> int:
    from rltok.threads import set_threads

    set_threads(args.threads)
    runs, dest = Path(args.runs), OUT / args.into
    for p in sorted(dest.glob("*.json")):
        if p.stem.startswith("_"):
            continue
        if args.only and p.stem not in args.only.split(","):
            continue
        try:
            m = json.loads(p.read_text())
        except json.JSONDecodeError:
            print(f"{p}: not readable now (being written?); skipped", file=sys.stderr)
            continue
        run = runs / p.stem
        if not (run / "summary.json").is_file():
            print(f"{p.stem}: no finished run under {runs}; skipped", file=sys.stderr)
            continue
        added = supplement_record(m, run)
        if added:
            tmp = p.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(m, indent=1))
            tmp.replace(p)
            print(f"{p.stem}: added {', '.join(added)}", flush=True)
    return 0


# -- report ---------------------------------------------------------------------------------------

def _variant(m: dict) -> str:
    if m["method"] == "rl" and m.get("rate_scope") in ("document", "content"):
        return "rl-doc" if m["rate_scope"] == "document" else "rl-content"
    return m["method"]


def _spread(values) -> dict:
    from rltok.analysis import spread

    v = [x for x in values if x is not None and math.isfinite(x)]
    d = spread(v)
    return {"cv": d["cv"], "max_over_min": d["max_over_min"], "n": len(v)}


def _mean_se(xs) -> dict:
    from rltok.evaluate import standard_error

    x = np.array(xs, dtype=float)
    return {"mean": float(x.mean()), "se": standard_error(x), "seeds": len(x), "per_seed": [float(a) for a in x]}


def _parallel_costs(rows: list[dict], key: str, langs=None) -> dict[str, float]:
    return {r["lang"]: r[key] for r in rows if key in r and (langs is None or r["lang"] in langs)}


def run_metrics(m: dict) -> dict:
    """Per run: the spread across languages of each cost, on each held-out set."""
    udhr_trained = set(UDHR_TRAINED)
    test = m["test"]
    out = {
        "test_bytes_per_chunk": _spread(r["bytes_per_chunk"] for r in test.values()),
        "test_chunks_per_word": _spread(r["chunks_per_word"] for r in test.values()),
        "test_bpb": _spread(r["bpb"] for r in test.values()),
        "test_mean_bpb": float(np.mean([r["bpb"] for r in test.values()])),
        "test_mean_rate": float(np.mean([r["rate"] for r in test.values()])),
    }
    for s, langs in (("reference", None), ("udhr_trained", udhr_trained), ("udhr_all", None)):
        rows = m["reference" if s == "reference" else "udhr"]
        for k in ("chunks_rel:m", "bits_rel:m", "bytes_per_chunk:m"):
            out[f"{s}_{k.split(':')[0]}"] = _spread(_parallel_costs(rows, k, langs).values())
    if "flores" in m:
        for s, langs in (("flores_trained", _flores_trained()), ("flores_all", None)):
            for k in ("chunks_rel:m", "bits_rel:m", "bytes_per_chunk:m"):
                out[f"{s}_{k.split(':')[0]}"] = _spread(_parallel_costs(m["flores"], k, langs).values())
    return out


def _flores_trained() -> set[str]:
    from rltok.data.languages import FLORES_OF
    return set(FLORES_OF.values())


FLORES_SETS = {  # results.json's flores section: set -> (records' key, languages: None = all)
    "flores_trained": ("flores", "trained"), "flores_all": ("flores", None),
    "reference_translated": ("reference_translated", None), "udhr_trained": ("udhr", "udhr")}
FLORES_COSTS = {"chunks_rel": "chunks per content (rel. English)", "bytes_per_chunk": "bytes per chunk",
                "bits_rel": "bits per content (rel. English)", "flops_rel": "training FLOPs per content (rel. English)"}
LEARNED = ("rl", "rl-doc", "rl-content", "entropy")  # the policies issue 39's goal is asked of


def _langs(which):
    return _flores_trained() if which == "trained" else set(UDHR_TRAINED) if which == "udhr" else None


def _goal_test(ratios: list[float]) -> dict:
    """Mean and SE over seeds of a CV ratio and the one-sided t-test of 'ratio < GOAL' (n - 1
    degrees of freedom); meets_goal at p < 0.05."""
    from scipy import stats

    d = _mean_se(ratios)
    n = len(ratios)
    if n < 2:
        return {**d, "p_below_goal": None, "meets_goal": False}
    if not d["se"] > 0:  # every seed the same ratio: below the goal or not, without doubt
        p = 0.0 if d["mean"] < GOAL else 1.0
        return {**d, "p_below_goal": p, "meets_goal": p < 0.05}
    p = float(stats.t.cdf((d["mean"] - GOAL) / d["se"], n - 1))
    return {**d, "p_below_goal": p, "meets_goal": p < 0.05}


def flores_section(by_variant: dict, ftoks: dict | None, sweep: dict | None = None) -> dict:
    """results.json's ``flores`` (issue 39): per method, mean and SE over seeds of the spread
    across languages (CV and max/min) of each cost on FLORES's scoring half (the training
    languages, and all 204) and on the Debian Reference without its untranslated lines; the
    main measure, ``cv_chunks_per_content``, is the CV over the training languages of chunks
    relative to English for the same sentences; its ratio to the same-data BPE's CV of tokens per
    content per seed, tested against the goal; bits per byte; per language, each cost's mean
    over seeds. The tokenizers' spreads beside them. ``sweep`` (bpe-sweep's record): the same-data
    BPE at other vocabulary sizes, and each method's ratio to the one nearest its own rate."""
    from rltok.errors import RltokError
    from study import paired_test  # the studies' paired t over seeds (tools/study.py)

    trained = _flores_trained()
    removed = None
    if by_variant:
        try:
            removed = _reference_translated()[1]
        except RltokError as e:  # the multilingual corpus is not here: the report goes on without it
            print(f"the translated-only Debian Reference: {e}", file=sys.stderr)
    out: dict = {"languages_trained": sorted(trained), "goal": f"CV ratio to the same-data BPE <= {GOAL}",
                 "half": "score (sentences 506-1011); rates calibrated on the calibration half (0-505) of the "
                         "training languages", "reference_translated_removed": removed, "methods": {},
                 "tokenizers": {}, "per_language": {}}
    points = sorted((sweep or {}).get("points", []), key=lambda q: q["tokens_per_byte_trained"])
    if points:
        out["bpe_by_vocabulary"] = {**{k: v for k, v in sweep.items() if k != "points"}, "points": points}
    if ftoks:
        for name in ftoks["tokenizers"]:
            rows = [r for r in ftoks["flores"] if r["lang"] in trained]
            t: dict = {"tokens_per_byte": sum(r[f"tokens:{name}"] for r in rows) / sum(r["bytes"] for r in rows)}
            for sname, (key, which) in FLORES_SETS.items():
                rows = ftoks.get(key)
                if rows:
                    t[sname] = {c: _spread(_parallel_costs(rows, f"{k}:{name}", _langs(which)).values())
                                for c, k in (("tokens_rel", "tokens_rel"), ("bytes_per_token", "bytes_per_token"))}
            t["cv_tokens_per_content"] = t["flores_trained"]["tokens_rel"]
            t["cv_tokens_per_content_all"] = t["flores_all"]["tokens_rel"]
            out["tokenizers"][name] = t
    ref = out["tokenizers"].get("bpe-same-data")
    bpb: dict[str, dict[int, float]] = {}
    for v, ms in by_variant.items():
        ms = sorted((m for m in ms if "flores" in m), key=lambda m: m["seed"])
        if not ms:
            continue
        d: dict = {"seeds": [m["seed"] for m in ms],
                   "calibrated_rate": [(m.get("flores_calibration") or {}).get("rate") for m in ms]}
        for sname, (key, which) in FLORES_SETS.items():
            have = [m for m in ms if m.get(key)]  # records measured before the translated-only Reference lack it
            d[sname] = {}
            for c in FLORES_COSTS:
                if c == "flops_rel" and not all(f"{c}:m" in m[key][0] for m in have):
                    continue
                sp = [_spread(_parallel_costs(m[key], f"{c}:m", _langs(which)).values()) for m in have]
                if sp:
                    d[sname][c] = {"cv": _mean_se([x["cv"] for x in sp]),
                                   "max_over_min": _mean_se([x["max_over_min"] for x in sp])}
        rate = [sum(r["chunks:m"] for r in m["flores"] if r["lang"] in trained)
                / sum(r["bytes"] for r in m["flores"] if r["lang"] in trained) for m in ms]
        d["rate_trained"] = _mean_se(rate)
        per_seed_bpb = [float(np.mean(list(_parallel_costs(m["flores"], "bpb:m", trained).values()))) for m in ms]
        bpb[v] = dict(zip(d["seeds"], per_seed_bpb))
        d["bpb_mean"] = _mean_se(per_seed_bpb)
        cvs = [_spread(_parallel_costs(m["flores"], "chunks_rel:m", trained).values())["cv"] for m in ms]
        d["cv_chunks_per_content"] = _mean_se(cvs)
        d["cv_chunks_per_content_all"] = d["flores_all"]["chunks_rel"]["cv"]
        if ref:
            d["ratio_to_same_data_bpe"] = _goal_test([c / ref["cv_tokens_per_content"]["cv"] for c in cvs])
        if points:  # the same-data BPE whose rate on FLORES is nearest the method's
            near = min(points, key=lambda q: abs(q["tokens_per_byte_trained"] - d["rate_trained"]["mean"]))
            d["ratio_to_rate_nearest_bpe"] = {**_goal_test([c / near["cv_tokens_per_content"]["cv"] for c in cvs]),
                                              "bpe_vocab_size": near["vocab_size"],
                                              "bpe_tokens_per_byte": near["tokens_per_byte_trained"],
                                              "method_tokens_per_byte": d["rate_trained"]["mean"],
                                              "bpe_lowest_rate": near is points[0]}
        out["methods"][v] = d
    # the price of each policy in bits per byte, paired by seed, against rl and against BPE guidance
    for v, d in out["methods"].items():
        for base in ("rl", "bpe"):
            if v != base and base in bpb:
                common = sorted(set(bpb[v]) & set(bpb[base]))
                if common:
                    d[f"bpb_minus_{base}"] = paired_test([bpb[v][s] for s in common], [bpb[base][s] for s in common])
    # per language: each cost's mean over seeds (and the tokenizers' counts)
    for v, ms in by_variant.items():
        ms = [m for m in ms if "flores" in m]
        costs = [c for c in (*FLORES_COSTS, "bpb") if ms and all(f"{c}:m" in m["flores"][0] for m in ms)]
        for r in (ms[0]["flores"] if ms else []):
            lang = r["lang"]
            row = out["per_language"].setdefault(lang, {"script": r["script"], "bytes_rel": r.get("bytes_rel"),
                                                       "trained": lang in trained})
            row[v] = {c: _mean_se([next(x for x in m["flores"] if x["lang"] == lang)[f"{c}:m"] for m in ms])
                      for c in costs}
    if ftoks:
        for r in ftoks["flores"]:
            row = out["per_language"].setdefault(r["lang"], {"script": r["script"], "bytes_rel": r.get("bytes_rel"),
                                                             "trained": r["lang"] in trained})
            for name in ftoks["tokenizers"]:
                row[name] = {"tokens_rel": r.get(f"tokens_rel:{name}"), "bytes_per_token": r[f"bytes_per_token:{name}"]}
    return out


def flores_verdict(fl: dict) -> dict:
    """Issue 39's question: does any learned policy spread its chunks per unit of content across
    the training languages at most GOAL times as unevenly as the same-data BPE spreads its tokens,
    and at what price in bits per byte?"""
    out = {"goal": fl["goal"], "test": "one-sided t over seeds of ratio < goal, p < 0.05", "policies": {}}
    for v in LEARNED:
        d = fl["methods"].get(v)
        if d and "ratio_to_same_data_bpe" in d:
            out["policies"][v] = {"ratio": d["ratio_to_same_data_bpe"], "bpb": d["bpb_mean"],
                                  **{k: d[k] for k in ("ratio_to_rate_nearest_bpe", "bpb_minus_rl", "bpb_minus_bpe")
                                     if k in d}}
    out["reached_by"] = [v for v, d in out["policies"].items() if d["ratio"]["meets_goal"]]
    return out


def _pm(d: dict | None, nd=3) -> str:
    if not d:
        return "–"
    if d.get("seeds", 1) > 1 and d.get("se") == d.get("se"):
        return f"{d['mean']:.{nd}f} ± {d['se']:.{nd}f}"
    return f"{d['mean']:.{nd}f}"


def verdict_text(v: dict) -> str:
    """The verdict as sentences, every number from ``flores_verdict``'s record."""
    def ratio(r):
        p = "" if r["p_below_goal"] is None else f", p(< {GOAL}) = {r['p_below_goal']:.3f}"
        return f"{_pm(r, 2)} ({r['seeds']} seed{'s' if r['seeds'] > 1 else ''}{p})"

    def cost(t):
        if not t:
            return "–"
        se = f" ± {t['se']:.3f}" if t["n"] > 1 else ""
        p = "" if t["p"] is None else f", p = {t['p']:.3f}"
        return f"{t['mean']:+.3f}{se}{p}"

    reached = ", ".join(v["reached_by"]) or "none"
    lines = [f"**Verdict** (goal: {v['goal']}; {v['test']}): reached by {reached}.", ""]
    for name, d in v["policies"].items():
        near = d.get("ratio_to_rate_nearest_bpe")
        lines.append(f"- {name}: CV ratio {ratio(d['ratio'])}"
                     + (f"; against the same-data BPE nearest its rate ({near['bpe_tokens_per_byte']:.3f} tokens/byte"
                        + (", the lowest it reaches" if near.get("bpe_lowest_rate") else "")
                        + f"; {name} at {near['method_tokens_per_byte']:.3f}) {ratio(near)}" if near else "")
                     + f"; bpb {_pm(d['bpb'])}"
                     + (f", − rl {cost(d['bpb_minus_rl'])}" if d.get("bpb_minus_rl") else "")
                     + f", − bpe {cost(d.get('bpb_minus_bpe'))}")
    return "\n".join(lines)


VERDICT_BEGIN = "<!-- flores-verdict: written by `tools/multilingual_study.py report` from results.json -->"
VERDICT_END = "<!-- /flores-verdict -->"


def with_readme_verdict(readme: str, v: dict) -> str:
    """``readme`` with the text between its verdict markers replaced by :func:`verdict_text` (the
    README's first lines state the verdict; generated, so no number in them is typed by hand)."""
    head, sep, rest = readme.partition(VERDICT_BEGIN)
    _, sep2, tail = rest.partition(VERDICT_END)
    if not sep or not sep2:
        raise ValueError(f"README lacks the markers {VERDICT_BEGIN!r} ... {VERDICT_END!r}")
    return f"{head}{VERDICT_BEGIN}\n{verdict_text(v)}\n{VERDICT_END}{tail}"


def flores_tables(fl: dict) -> str:
    """tables_flores.md: the spread table (methods, then the tokenizers) and the per-language
    table of chunks per content relative to English."""
    methods = [v for v in METHOD_ORDER if v in fl["methods"]]
    rm = fl["reference_translated_removed"]
    n = len(fl["languages_trained"])
    lines = [f"### FLORES-200, the {n} training languages' scoring half: spread across languages "
             "(CV = std/mean; mean ± SE over seeds)", "",
             f"| method | seeds | calibrated rate | chunks (tokens) per byte, {n} langs | bpb (mean, {n} langs) | CV chunks/content "
             f"| ratio to same-data BPE | p (ratio < {GOAL}) | max/min chunks/content | CV bytes/chunk | CV bits/content "
             "| CV FLOPs/content | CV chunks/content (all 204) | CV chunks/content (Reference, translated) "
             "| CV chunks/content (UDHR, 20 trained) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for v in methods:
        d = fl["methods"][v]
        t, r = d["flores_trained"], d.get("ratio_to_same_data_bpe")
        cal = [c for c in d["calibrated_rate"] if c is not None]
        cells = [v, str(len(d["seeds"])), f"{np.mean(cal):.3f}" if cal else "not calibrated (no knob)",
                 _pm(d["rate_trained"]), _pm(d["bpb_mean"]), _pm(d["cv_chunks_per_content"]), _pm(r, 2),
                 "–" if not r or r["p_below_goal"] is None else f"{r['p_below_goal']:.3f}",
                 _pm(t["chunks_rel"]["max_over_min"], 2), _pm(t["bytes_per_chunk"]["cv"]), _pm(t["bits_rel"]["cv"]),
                 _pm(t.get("flops_rel", {}).get("cv")), _pm(d["flores_all"]["chunks_rel"]["cv"]),
                 _pm(d["reference_translated"].get("chunks_rel", {}).get("cv")),
                 _pm(d["udhr_trained"].get("chunks_rel", {}).get("cv"))]
        lines.append("| " + " | ".join(cells) + " |")
    for name, t in fl["tokenizers"].items():
        ref_t = t.get("reference_translated", {}).get("tokens_rel", {})
        udhr_t = t.get("udhr_trained", {}).get("tokens_rel", {})
        lines.append(f"| {name} (tokenizer) | – | – | {t['tokens_per_byte']:.3f} | – "
                     f"| {t['flores_trained']['tokens_rel']['cv']:.3f} | – | – "
                     f"| {t['flores_trained']['tokens_rel']['max_over_min']:.2f} "
                     f"| {t['flores_trained']['bytes_per_token']['cv']:.3f} | – | – "
                     f"| {t['flores_all']['tokens_rel']['cv']:.3f} | {'–' if 'cv' not in ref_t else format(ref_t['cv'], '.3f')} "
                     f"| {'–' if 'cv' not in udhr_t else format(udhr_t['cv'], '.3f')} |")
    if rm:
        lines += ["", f"Debian Reference, translated lines only: {rm['line_positions_removed']:.1%} of the "
                  f"{rm['line_positions']} line positions removed (a line some language left in English leaves every "
                  "language; so do commands, code and names that every language writes as English does: what is "
                  "left is mostly prose); bytes removed per language: "
                  + ", ".join(f"{k} {x['bytes_removed']:.0%}" for k, x in rm["languages"].items()) + "."]
    bv = fl.get("bpe_by_vocabulary")
    if bv:
        lines += ["", "### The same-data BPE at other vocabulary sizes (fitted on the same "
                  f"{bv['fitted_on']['fit_bytes'] / 1e6:.1f} MB of training text; FLORES scoring half, "
                  f"{len(fl['languages_trained'])} training languages)"
                  + {True: "; refitted at its own size it gives the guidance BPE's token counts exactly",
                     False: "; NOTE: refitted at its own size it does NOT give the guidance BPE's token counts"}.get(
                      bv.get("reproduces_guidance_bpe"), ""), "", "| vocabulary | tokens per byte (calibration half) | tokens per byte (scoring half) "
                  "| CV tokens/content | max/min tokens/content | CV tokens/content (all 204) |", "|---|---|---|---|---|---|"]
        for q in bv["points"]:
            lines.append(f"| {q['vocab_size']:,} | {q['tokens_per_byte_calibration']:.3f} | {q['tokens_per_byte_trained']:.3f} "
                         f"| {q['cv_tokens_per_content']['cv']:.3f} | {q['cv_tokens_per_content']['max_over_min']:.2f} "
                         f"| {q['cv_tokens_per_content_all']['cv']:.3f} |")
        lines.append("")
        for v in methods:
            r = fl["methods"][v].get("ratio_to_rate_nearest_bpe")
            if r:
                p = "–" if r["p_below_goal"] is None else f"{r['p_below_goal']:.3f}"
                lines.append(f"- {v} (at {r['method_tokens_per_byte']:.3f} chunks/byte): CV ratio to the same-data BPE "
                             f"nearest its rate (vocabulary {r['bpe_vocab_size']:,}"
                             + (", the lowest rate it reaches" if r["bpe_lowest_rate"] else "") + ", "
                             f"{r['bpe_tokens_per_byte']:.3f} tokens/byte): {_pm(r, 2)}, p (ratio < {GOAL}) = {p}")
    lines.append("")
    for v in methods:
        d = fl["methods"][v]
        for base in ("rl", "bpe"):
            t = d.get(f"bpb_minus_{base}")
            if t:
                p = "–" if t["p"] is None else f"{t['p']:.3f}"
                se = f" ± {t['se']:.3f}" if t["n"] > 1 else ""
                lines.append(f"- FLORES bpb, {v} − {base}: {t['mean']:+.3f}{se} over {t['n']} seed{'s' if t['n'] > 1 else ''}"
                             f" (paired by seed), p = {p}")
    toks = list(fl["tokenizers"])
    costs = [c for c in FLORES_COSTS if any(c in r.get(v, {}) for r in fl["per_language"].values() for v in methods)]
    lines += ["", "### FLORES-200, the training languages: every cost per language (mean over seeds; "
              + "; ".join(FLORES_COSTS[c] for c in costs) + "; bits per byte)", "",
              "| language | method | " + " | ".join(costs) + " | bpb |", "|---|---|" + "---|" * (len(costs) + 1)]
    for lang, row in sorted((k, r) for k, r in fl["per_language"].items() if r["trained"]):
        for v in methods:
            if v in row:
                lines.append(f"| {lang} | {v} | " + " | ".join(_pm(row[v].get(c), 3) for c in costs)
                             + f" | {_pm(row[v].get('bpb'), 3)} |")
    lines += ["", "### FLORES-200 per language: chunks (tokens) for the same sentences relative to English "
              "(mean ± SE over seeds); * = a training language", "",
              "| language | script | bytes rel | " + " | ".join(methods) + " | " + " | ".join(toks) + " |",
              "|---|---|---|" + "---|" * (len(methods) + len(toks))]
    order = sorted(fl["per_language"].items(), key=lambda kv: (not kv[1]["trained"], kv[0]))
    for lang, row in order:
        cells = [f"{lang}{' *' if row['trained'] else ''}", row["script"],
                 "–" if row["bytes_rel"] is None else f"{row['bytes_rel']:.2f}"]
        cells += [_pm(row[v]["chunks_rel"], 2) if v in row else "–" for v in methods]
        cells += ["–" if row.get(t, {}).get("tokens_rel") is None else f"{row[t]['tokens_rel']:.2f}" for t in toks]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def flores_chart(fl: dict, out: Path) -> None:
    """Chunks (tokens) per content relative to English on FLORES, the training languages, per
    method (error bars: SE over seeds) and tokenizer."""
    methods = [v for v in METHOD_ORDER if v in fl["methods"]]
    toks = list(fl["tokenizers"])
    langs = sorted((k for k, r in fl["per_language"].items() if r["trained"] and k != "eng_Latn"),
                   key=lambda k: fl["per_language"][k]["bytes_rel"] or 0)
    series = []
    for v in methods:
        ds = [fl["per_language"][k][v]["chunks_rel"] for k in langs]
        err = np.array([x["se"] if x["seeds"] > 1 else 0.0 for x in ds])
        n = len(fl["methods"][v]["seeds"])
        series.append((f"{v} ({n} seed{'s' if n > 1 else ''})", np.array([x["mean"] for x in ds]), err))
    for t in toks:
        series.append((f"{t} (tokenizer)", np.array([fl["per_language"][k][t]["tokens_rel"] for k in langs]), None))
    series.append(("UTF-8 bytes", np.array([fl["per_language"][k]["bytes_rel"] for k in langs]), None))
    cost_bars(series, [k.replace("_", "\n") for k in langs], out, width=16, tick_size=7, ncol=5,
              ylabel="chunks (tokens) for the same sentences,\nrelative to English (log scale)",
              title="FLORES-200 devtest (sentences 506-1011), the training languages: cost of the same content "
                    "relative to English (tiny, 8 MB at T = 2; error bars: SE over seeds)")


def cost_bars(series: list[tuple[str, np.ndarray, np.ndarray | None]], labels: list[str], out: Path, *,
              width: float, tick_size: int, ncol: int, ylabel: str, title: str) -> None:
    """Grouped bars, one group per language and one bar per (label, values, SE or None) series,
    on a log-2 axis around English's 1 (ratios: 2x and 1/2 as far from English)."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, 5.5))
    k = len(series)
    w = 0.85 / k
    xs = np.arange(len(labels))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (lab, v, e) in enumerate(series):
        ax.bar(xs + (i - (k - 1) / 2) * w, v, width=w, yerr=e, label=lab, color=colors[i % len(colors)],
               capsize=1.5, error_kw={"lw": 0.7})
    ax.axhline(1.0, color="#333", lw=0.8)
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xticks(xs, labels, fontsize=tick_size)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, ncol=ncol, loc="upper left")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def tokenizer_metrics(t: dict) -> dict[str, dict]:
    out = {}
    for name in ("bpe-same-data", "gpt-neox"):
        d = {"test_bytes_per_token": _spread(r[name]["bytes_per_token"] for r in t["test"].values()),
             "test_tokens_per_word": _spread(r[name]["tokens_per_word"] for r in t["test"].values())}
        for s, langs in (("reference", None), ("udhr_trained", set(UDHR_TRAINED)), ("udhr_all", None)):
            rows = t["reference" if s == "reference" else "udhr"]
            d[f"{s}_tokens_rel"] = _spread(_parallel_costs(rows, f"tokens_rel:{name}", langs).values())
            d[f"{s}_bytes_per_token"] = _spread(_parallel_costs(rows, f"bytes_per_token:{name}", langs).values())
        out[name] = d
    return out


def cmd_report(args) -> int:
    meas = OUT / "measure"
    runs = {p.stem: json.loads(p.read_text()) for p in sorted(meas.glob("*.json")) if not p.stem.startswith("_")}
    toks = json.loads((meas / "_tokenizers.json").read_text())
    by_variant: dict[str, list[dict]] = {}
    for m in runs.values():
        m["variant"] = _variant(m)
        m["metrics"] = run_metrics(m)
        by_variant.setdefault(m["variant"], []).append(m)
    tm = tokenizer_metrics(toks)
    summary = {}
    for v, ms in by_variant.items():
        keys = [k for k in ms[0]["metrics"] if all(k in m["metrics"] for m in ms)]  # FLORES: newer runs only
        summary[v] = {k: _mean_se([m["metrics"][k]["cv"] if isinstance(m["metrics"][k], dict) else m["metrics"][k]
                                   for m in ms]) for k in keys}
        summary[v]["max_over_min"] = {k: _mean_se([m["metrics"][k]["max_over_min"] for m in ms])
                                      for k in keys if isinstance(ms[0]["metrics"][k], dict)}
    # the FLORES study's runs (8 MB, issue 39) are measured into their own folder: their names
    # (rl_s1, ...) are the 4 MB study's too
    fl = OUT / FLORES_RECORDS
    flores_runs = by_variant
    if fl.is_dir():
        flores_runs = {}
        for p in sorted(fl.glob("*.json")):
            if not p.stem.startswith("_"):
                m = json.loads(p.read_text())
                flores_runs.setdefault(_variant(m), []).append(m)
    # the tokenizers of the same study: the 8 MB runs' same-data BPE is their own bpe_s42's
    ft = fl / "_flores_tokenizers.json" if fl.is_dir() else meas / "_flores_tokenizers.json"
    ftoks = json.loads(ft.read_text()) if ft.is_file() else None
    if ftoks is None:
        print(f"{ft}: missing (`flores-tokenizers RUNS --into {ft.parent.name}`): the FLORES section has no "
              "tokenizer rows and no ratio to the same-data BPE", file=sys.stderr)
    elif (fl / "_tokenizers.json").is_file():  # the same tokenizers on UDHR (measure's first run writes it)
        ftoks["udhr"] = json.loads((fl / "_tokenizers.json").read_text())["udhr"]
    sw = fl / "_flores_bpe_sweep.json"
    result = {"runs": runs, "tokenizers": toks, "tokenizer_metrics": tm, "summary": summary,
              "flores": flores_section(flores_runs, ftoks, json.loads(sw.read_text()) if sw.is_file() else None),
              "notes": {"test": "test split of --data multilingual, <= 32 kB per language, every byte scored",
                        "reference": "Debian Reference ch03+ch08, 11 languages, line-aligned but partly left in English",
                        "reference_translated": "the same without every line some language left in English",
                        "udhr": "UDHR 37 languages, parallel; udhr_trained: the 20 training languages",
                        "cv": "std/mean across languages (population std); summary: mean and SE over seeds"}}
    result["verdict"] = verdict(by_variant, tm)
    result["flores_verdict"] = flores_verdict(result["flores"])
    (OUT / "results.json").write_text(json.dumps(result, indent=1))
    (OUT / "tables.md").write_text(tables(by_variant, summary, tm, toks) + "\n")
    chart(by_variant, toks, OUT / "cost_vs_english.png")
    wrote = "results.json, tables.md, cost_vs_english.png"
    if result["flores"]["methods"]:
        (OUT / "tables_flores.md").write_text(verdict_text(result["flores_verdict"]) + "\n\n"
                                              + flores_tables(result["flores"]) + "\n")
        wrote += ", tables_flores.md"
        readme = OUT / "README.md"
        text = readme.read_text() if readme.is_file() else ""
        if VERDICT_BEGIN in text:
            try:
                readme.write_text(with_readme_verdict(text, result["flores_verdict"]))
            except ValueError as e:  # a marker edited away: say so, leave the README as it is
                sys.exit(f"{readme}: {e}")
            wrote += ", README.md's verdict"
        if result["flores"]["tokenizers"]:
            flores_chart(result["flores"], OUT / "flores_cost_vs_english.png")
            wrote += ", flores_cost_vs_english.png"
    print(f"wrote {OUT}: {wrote}")
    return 0


FLORES_RECORDS = "measure-8M"  # the FLORES study's measurements (run_flores.sh: measure --into)
GOAL = 0.8  # issue 39: a learned policy's CV of chunks per content <= 0.8x the same-data BPE's


def verdict(by_variant: dict, tm: dict) -> dict:
    """Per learned variant and parallel set: its CV across languages of chunks per unit of
    content (chunks relative to English for the same text) over the same-data BPE's CV of tokens
    per content, per seed, with mean and SE, against the goal."""
    out = {"goal": f"ratio <= {GOAL}", "ratios": {}}
    bpe = tm["bpe-same-data"]
    for v in ("rl", "rl-doc", "rl-content", "entropy"):
        for s in ("reference", "udhr_trained"):
            ms = by_variant.get(v, [])
            if not ms:
                continue
            r = _mean_se([m["metrics"][f"{s}_chunks_rel"]["cv"] / bpe[f"{s}_tokens_rel"]["cv"] for m in ms])
            r["seed_ids"] = [m["seed"] for m in ms]
            r["meets_goal"] = bool(r["mean"] + 2 * r["se"] <= GOAL)
            out["ratios"][f"{v}:{s}"] = r
    return out


def _ms(d: dict, nd=3) -> str:
    if d["seeds"] > 1:
        return f"{d['mean']:.{nd}f} ± {d['se']:.{nd}f}"
    return f"{d['mean']:.{nd}f}"


def tables(by_variant, summary, tm, toks) -> str:
    variants = [v for v in METHOD_ORDER if v in by_variant]
    lines = ["### Spread across languages (CV = std/mean; seeds: mean ± SE over seeds)", "",
             "| method | seeds | test bpb (mean over langs) | test rate | CV bytes/chunk (test) | CV chunks/word (test) "
             "| CV chunks rel. EN (reference, 11) | max/min (reference) | CV chunks rel. EN (UDHR, 20 trained) "
             "| max/min (UDHR 20) | CV bits rel. EN (UDHR 20) | CV bpb (test) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for v in variants:
        s = summary[v]
        mm = s["max_over_min"]
        lines.append(f"| {v} | {len(by_variant[v])} | {_ms(s['test_mean_bpb'])} | {_ms(s['test_mean_rate'])} "
                     f"| {_ms(s['test_bytes_per_chunk'], 2)} | {_ms(s['test_chunks_per_word'], 2)} "
                     f"| {_ms(s['reference_chunks_rel'], 2)} | {_ms(mm['reference_chunks_rel'], 2)} "
                     f"| {_ms(s['udhr_trained_chunks_rel'], 2)} | {_ms(mm['udhr_trained_chunks_rel'], 2)} "
                     f"| {_ms(s['udhr_trained_bits_rel'], 2)} | {_ms(s['test_bpb'], 2)} |")
    for name, d in tm.items():
        lines.append(f"| tokenizer: {name} | - | - | - | {d['test_bytes_per_token']['cv']:.2f} "
                     f"| {d['test_tokens_per_word']['cv']:.2f} | {d['reference_tokens_rel']['cv']:.2f} "
                     f"| {d['reference_tokens_rel']['max_over_min']:.2f} | {d['udhr_trained_tokens_rel']['cv']:.2f} "
                     f"| {d['udhr_trained_tokens_rel']['max_over_min']:.2f} | - | - |")
    # per language on the test split: bpb and bytes/chunk, mean over seeds
    langs = sorted(next(iter(by_variant.values()))[0]["test"])
    lines += ["", "### Per language, test split (mean over seeds): bits/byte · bytes per chunk", "",
              "| lang | " + " | ".join(variants) + " | BPE same data: bytes/token | GPT-NeoX: bytes/token | "
              "rl-doc − rl bpb |", "|---|" + "---|" * (len(variants) + 3)]
    for lang in langs:
        cells = []
        bpb = {}
        for v in variants:
            b = [m["test"][lang]["bpb"] for m in by_variant[v] if lang in m["test"]]
            c = [m["test"][lang]["bytes_per_chunk"] for m in by_variant[v] if lang in m["test"]]
            bpb[v] = b
            cells.append(f"{np.mean(b):.3f} · {np.mean(c):.2f}")
        t = toks["test"][lang]
        diff = "-"
        if bpb.get("rl") and bpb.get("rl-doc"):
            a, b = np.array(bpb["rl-doc"]), np.array(bpb["rl"])
            se = math.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b)) if len(a) > 1 and len(b) > 1 else float("nan")
            diff = f"{a.mean() - b.mean():+.3f} ± {se:.3f}"
        lines.append(f"| {lang} | " + " | ".join(cells) + f" | {t['bpe-same-data']['bytes_per_token']:.2f} "
                     f"| {t['gpt-neox']['bytes_per_token']:.2f} | {diff} |")
    # per language on UDHR: chunks relative to English
    rows0 = {r["lang"]: r for r in toks["udhr"]}
    lines += ["", "### UDHR, the 20 training languages: chunks (tokens) for the same text relative to English "
              "(mean over seeds)", "",
              "| UDHR | lang | script | bytes rel | " + " | ".join(variants) + " | BPE same data | GPT-NeoX |",
              "|---|---|---|---|" + "---|" * (len(variants) + 2)]
    for key, lang in UDHR_TRAINED.items():
        r0 = rows0[key]
        cells = []
        for v in variants:
            c = [next(r for r in m["udhr"] if r["lang"] == key)["chunks_rel:m"] for m in by_variant[v]]
            cells.append(f"{np.mean(c):.2f}")
        lines.append(f"| {key} | {lang} | {r0['script']} | {r0['bytes_rel']:.2f} | " + " | ".join(cells)
                     + f" | {r0['tokens_rel:bpe-same-data']:.2f} | {r0['tokens_rel:gpt-neox']:.2f} |")
    return "\n".join(lines)


def chart(by_variant, toks, out: Path) -> None:
    variants = [v for v in METHOD_ORDER if v in by_variant]
    keys = sorted(UDHR_TRAINED, key=lambda k: next(r for r in toks["udhr"] if r["lang"] == k)["tokens_rel:gpt-neox"])
    series = []
    for v in variants:
        vals = np.array([[next(r for r in m["udhr"] if r["lang"] == k)["chunks_rel:m"] for k in keys]
                         for m in by_variant[v]])
        err = vals.std(axis=0, ddof=1) / math.sqrt(len(vals)) if len(vals) > 1 else None
        series.append((f"{v} ({len(vals)} seed{'s' if len(vals) > 1 else ''})", vals.mean(0), err))
    rows = {r["lang"]: r for r in toks["udhr"]}
    series.append(("BPE, same data and rate", np.array([rows[k]["tokens_rel:bpe-same-data"] for k in keys]), None))
    series.append(("GPT-NeoX BPE", np.array([rows[k]["tokens_rel:gpt-neox"] for k in keys]), None))
    series.append(("UTF-8 bytes", np.array([rows[k]["bytes_rel"] for k in keys]), None))
    cost_bars(series, [f"{UDHR_TRAINED[k]}\n{rows[k]['script']}" for k in keys], out, width=15, tick_size=8, ncol=4,
              ylabel="chunks (tokens) for the same text, relative to English (log scale)",
              title="UDHR, the 20 training languages: cost of the same content relative to English "
                    "(tiny models, 4 MB of multilingual training; error bars: SE over seeds)")


PICTURE_LANGS = {"deu_1996": "Latin", "rus": "Cyrillic", "jpn": "CJK", "cmn_hans": "CJK", "ell_monotonic": "Greek"}


def cmd_pictures(args) -> int:
    """Boundary pictures (``rltok boundaries --png --html``) of UDHR's preamble and first articles
    in a few scripts, for the given runs."""
    import subprocess

    from rltok.analysis import read_udhr

    texts = {t.key: t for t in read_udhr(UDHR, list(PICTURE_LANGS))}
    dest = OUT / "boundaries"
    dest.mkdir(parents=True, exist_ok=True)
    for run in args.runs:
        name = Path(run).name
        for key in PICTURE_LANGS:
            text = "\n".join(texts[key].paragraphs[:4])
            base = dest / f"{name}_{key}"
            subprocess.run([sys.executable, "-m", "rltok", "boundaries", run, f"--text={text}", "--max-bytes", "1200",
                            "--png", str(base) + ".png", "--html", str(base) + ".html", "--threads", "1"],
                           check=True, stdout=subprocess.DEVNULL)
            print(f"wrote {base}.png/.html")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default=None, help="results folder (default: results/multilingual of this checkout)")
    p.add_argument("--udhr", default=None, help="UDHR folder (default: ../shared/data/multilingual/udhr of this checkout)")
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("runs", nargs="?", default="runs/multilingual")
    m.add_argument("--threads", type=int, default=1)
    m.add_argument("--shard", default="0/1", help="K/N: measure every N-th run from the K-th (run N side by side)")
    m.add_argument("--only", default="", help="NAME[,NAME]: measure only these runs (a run measured as soon as "
                                              "it has trained keeps its record when the session's runs are lost)")
    m.add_argument("--into", default="measure", help="records folder under the results folder (the FLORES "
                                                     f"study's 8 MB runs: {FLORES_RECORDS})")
    m.set_defaults(func=cmd_measure)
    su = sub.add_parser("supplement", help="add what older records lack (the translated-only Debian Reference, "
                                           "FLOPs per parallel row) from their runs")
    su.add_argument("runs")
    su.add_argument("--into", default=FLORES_RECORDS)
    su.add_argument("--only", default="")
    su.add_argument("--threads", type=int, default=1)
    su.set_defaults(func=cmd_supplement)
    pic = sub.add_parser("pictures")
    pic.add_argument("runs", nargs="+")
    pic.set_defaults(func=cmd_pictures)
    ft = sub.add_parser("flores-tokenizers", help="GPT-NeoX's BPE (and RUNS/bpe_s42's, where present) on FLORES-200")
    ft.add_argument("runs", nargs="?", default="")
    ft.add_argument("--into", default="measure")
    ft.set_defaults(func=cmd_flores_tokenizers)
    bs = sub.add_parser("bpe-sweep", help="the same-data BPE at other vocabulary sizes on FLORES-200 (its CV "
                                          "against its rate)")
    bs.add_argument("runs")
    bs.add_argument("--vocab", default="16384,32768,65536,262144", help="sizes to fit besides the guidance BPE's own")
    bs.add_argument("--into", default=FLORES_RECORDS)
    bs.set_defaults(func=cmd_bpe_sweep)
    r = sub.add_parser("report")
    r.set_defaults(func=cmd_report)
    args = p.parse_args(argv)
    global OUT, UDHR
    if args.results:
        OUT = Path(args.results).resolve()
    if args.udhr:
        UDHR = Path(args.udhr).resolve()
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
