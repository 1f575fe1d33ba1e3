"""rltok analyze"""

from __future__ import annotations

import json
import math
from pathlib import Path

from . import HelpFormatter, add_threads_arg, apply_threads, device_arg, positive_int, seed_arg


def register(sub) -> None:
    p = sub.add_parser(
        "analyze", help="boundary statistics of runs, and their token cost across 37 languages",
        description="Boundary statistics of one or more runs on documents: rate, chunk-length "
                    "histogram, whitespace recall/precision, precision/recall/F1 against BPE "
                    "boundaries, boundary entropy, bits-per-byte. With --udhr DIR (the UDHR in 37 "
                    "languages, e.g. ../shared/data/multilingual/udhr): bytes per chunk and chunks per "
                    "word of each run vs BPE tokens per word vs whitespace words, relative to English "
                    "(a table and a bar chart).",
        formatter_class=HelpFormatter)
    p.add_argument("runs", nargs="+", help="run directories")
    p.add_argument("--data", default=None,
                   help="data source to analyze (all its documents); default: each run's validation split")
    p.add_argument("--docs", type=positive_int, default=64, help="analyze the first N documents")
    p.add_argument("--udhr", default=None, help="folder of udhr_*.xml translations: the cross-language table")
    p.add_argument("--langs", default=None, help="comma-separated UDHR keys (default: all), e.g. eng,jpn,hin")
    p.add_argument("--bpe", action="append", default=[], metavar="TOKENIZER_JSON",
                   help="a tokenizers JSON to compare with (repeatable; e.g. the GPT-NeoX BPE that "
                        "`rltok data fetch-evals` stores as gpt-neox-20b.json)")
    p.add_argument("--no-fit-bpe", action="store_true",
                   help="do not train the rate-matched BPE on the first run's training split")
    p.add_argument("--out", default=None, help="folder for analysis.json, udhr.md/.csv and the charts")
    p.add_argument("--greedy", action="store_true", help="greedy boundaries instead of a sample")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed of the boundary sample")
    p.add_argument("--batch-size", type=positive_int, default=16, help="pieces per forward pass")
    p.add_argument("--device", type=device_arg, default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default=None, help="default: each run's training dtype")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_threads_arg(p)
    p.set_defaults(func=run)


def _label(path: str, seen: set) -> str:
    name = Path(path).name or str(path)
    while name in seen:
        name += "'"
    seen.add(name)
    return name


def run(args) -> int:
    apply_threads(args)
    from ..analysis import boundary_stats, cross_language, disparity, read_udhr, run_bpe, udhr_table
    from ..bpe import load_tokenizer
    from ..data import load_splits
    from ..data.sources import load_corpus
    from ..run import load_model

    progress = not (args.no_progress or args.json)
    seen: set = set()
    models = {_label(r, seen): load_model(r, device=args.device) for r in args.runs}
    toks = {}
    for path in args.bpe:
        tok = load_tokenizer(path)
        tok.normalizer = None  # tokens must cover the bytes as they are (e.g. GPT-NeoX normalizes to NFC)
        toks[_label(Path(path).stem, seen)] = tok
    first = next(iter(models.values()))
    if not args.no_fit_bpe:
        tok, lab = run_bpe(first.run_config, progress=progress)
        toks[_label(lab, seen)] = tok
    ref_tok = next(iter(toks.values()), None)
    kw = {"seed": args.seed, "mode": "greedy" if args.greedy else "sample", "batch_size": args.batch_size}
    result: dict = {"runs": {}, "tokenizers": list(toks)}
    stats = {}
    for name, m in models.items():
        cfg = m.run_config
        if args.data:
            corpus = load_corpus(args.data, cfg.data)
            where = args.data
        else:
            corpus = load_splits(cfg).val
            where = f"{cfg.data.source} [val]"
        docs = [corpus.doc_bytes(i) for i in range(min(args.docs, len(corpus)))]
        st = boundary_stats(m, docs, ref_tok, dtype=args.dtype or cfg.train.dtype,
                            progress=name if progress else False, **kw)
        stats[name] = st
        result["runs"][name] = {"method": cfg.method, **m.weights, "data": where, **st.to_dict()}
    if args.udhr:
        langs = args.langs.split(",") if args.langs else None
        texts = read_udhr(args.udhr, langs)
        rows = cross_language(texts, models, toks, progress=progress, dtype="fp32", **kw)
        result["udhr"] = rows
        result["udhr_disparity"] = {k: disparity(rows, k) for k in
                                    ["bytes_rel"] + [f"chunks_rel:{r}" for r in models] + [f"tokens_rel:{t}" for t in toks]}
    if args.out:
        from ..checkpoint import write_json_atomic
        from ..viz import plot_chunk_hist, plot_udhr

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "analysis.json", result)
        plot_chunk_hist(stats, out / "chunk_lengths.png")
        if args.udhr:
            (out / "udhr.md").write_text(udhr_table(result["udhr"], list(models), list(toks)) + "\n")
            import csv

            with open(out / "udhr.csv", "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(result["udhr"][0]))
                w.writeheader()
                w.writerows(result["udhr"])
            plot_udhr(result["udhr"], list(models), list(toks), out / "udhr.png")
    if args.json:
        print(json.dumps(result, default=lambda x: None if isinstance(x, float) and math.isnan(x) else x))
        return 0
    bpe_name = next(iter(toks), "-")
    print(f"{'run':<16} {'method':<8} {'rate':>6} {'B/chunk':>7} {'ws rec':>6} {'ws prec':>7} "
          f"{'F1 ' + bpe_name:>12} {'entropy':>7} {'bpb':>6}")
    for name, r in result["runs"].items():
        print(f"{name:<16} {r['method']:<8} {r['rate']:>6.3f} {r['mean_chunk_bytes']:>7.2f} "
              f"{r['whitespace_recall']:>6.3f} {r['whitespace_precision']:>7.3f} {r['bpe_f1']:>12.3f} "
              f"{r['entropy_bits']:>7.3f} {r['bpb']:>6.3f}")
    for name, st in stats.items():
        h = st.chunk_hist
        tot = max(1, sum(h))
        print(f"  {name} chunk lengths: " + " ".join(f"{k + 1}{'+' if k == len(h) - 1 else ''}:{100 * c / tot:.0f}%"
                                                   for k, c in enumerate(h) if c))
    if args.udhr:
        print()
        print(udhr_table(result["udhr"], list(models), list(toks)))
        for k, d in result["udhr_disparity"].items():
            print(f"  spread across languages of {k}: max/min {d['max_over_min']:.2f}, CV {d['cv']:.2f}")
    if args.out:
        print(f"wrote {args.out}/analysis.json, chunk_lengths.png" + (", udhr.md, udhr.csv, udhr.png" if args.udhr else ""))
    return 0
