"""rltok eval"""

from __future__ import annotations

import json

from . import HelpFormatter, add_threads_arg, apply_threads, device_arg, positive_int, seed_arg


def register(sub) -> None:
    p = sub.add_parser(
        "eval", help="bits-per-byte and boundary statistics on held-out documents",
        description="Score held-out documents of a data source (by default the run's own "
                    "validation split) with a trained run: mean per-document bits-per-byte with its "
                    "standard error, corpus bits-per-byte, boundary rate and whitespace recall/precision. "
                    "By default each document is scored as BOS + its first seq_len bytes, as the "
                    "paper does (the rest of a longer document is not scored); --whole scores every "
                    "byte. The weights used (final, or the newest checkpoint of an unfinished run) are "
                    "named in the output.",
        formatter_class=HelpFormatter)
    p.add_argument("run", help="run directory")
    p.add_argument("--data", default=None, help="data source (default: the run's training source)")
    p.add_argument("--split", default="val", choices=["val", "test", "train", "all"],
                   help="which split of the source, split exactly as in training")
    p.add_argument("--docs", type=positive_int, default=None, help="score the first N documents of the split")
    p.add_argument("--whole", action="store_true",
                   help="score whole documents, not only their first seq_len bytes: each document is "
                        "cut into windows of seq_len bytes that score every byte once (see --stride)")
    p.add_argument("--stride", type=positive_int, default=None,
                   help="with --whole: bytes between window starts (default seq_len: consecutive "
                        "windows; smaller: overlapping windows, each scored byte with at least "
                        "seq_len - stride bytes of context)")
    p.add_argument("--rate", type=float, default=None,
                   help="run a rate-conditioned model (trained with boundary.rate_schedule) at this "
                        "boundary rate (default: its boundary.target_rate)")
    p.add_argument("--calibrate-rate", action="store_true",
                   help="first move the router's rate knob (rl: its logit offset; hnet with "
                        "rate_control=threshold: its threshold) so that its rate on the validation split "
                        "of the data scored (--data, default the run's own; its first 256 documents, scored "
                        "as here) is boundary.target_rate, then score: a comparison at equal rate on the evaluation "
                        "text, not only on the training stream (also applied to --against where it can be)")
    p.add_argument("--samples", type=positive_int, default=1, help="boundary samples averaged per document")
    p.add_argument("--greedy", action="store_true", help="greedy boundaries (probability > 0.5) instead of sampling")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed of the evaluation boundary samples")
    p.add_argument("--batch-size", type=positive_int, default=8, help="documents per forward pass")
    p.add_argument("--device", type=device_arg, default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default=None, help="default: the run's training dtype")
    p.add_argument("--checkpoint", default=None, help="evaluate a checkpoint (e.g. step_00000100) instead of the final weights")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_threads_arg(p)
    p.add_argument("--per-doc", action="store_true", help="include per_doc_bpb (input order) in the JSON")
    p.add_argument("--against", default=None, metavar="RUN2",
                   help="also score RUN2 on the same documents with the same boundary draws and report "
                        "the paired per-document difference RUN - RUN2 with its standard error")
    p.set_defaults(func=run)


def run(args) -> int:
    apply_threads(args)
    from ..data import load_splits
    from ..data.corpus import Corpus
    from ..evaluate import evaluate_corpus, rate_knob
    from ..schema import RATE_TARGETED, off_target
    from ..errors import RltokError
    from ..run import describe_weights, load_model

    model = load_model(args.run, device=args.device, checkpoint=args.checkpoint)
    cfg = model.run_config
    if args.stride is not None and not args.whole:
        raise RltokError("--stride needs --whole")
    if args.stride is not None and args.stride > cfg.model.seq_len:
        raise RltokError(f"--stride {args.stride} is longer than the model's context (seq_len {cfg.model.seq_len})")
    if args.data is not None:
        cfg.data.source = args.data
    splits = load_splits(cfg) if args.split != "all" or args.calibrate_rate else None
    if args.split == "all":
        from ..data.sources import load_corpus

        corpus: Corpus = load_corpus(cfg.data.source, cfg.data)
    else:
        corpus = getattr(splits, args.split)
        if len(corpus) == 0:  # scored, an empty split would print nan
            hint = (f"the run holds out data.test_docs={cfg.data.test_docs} test documents: score --split val, "
                    "or train with --set data.test_docs=N" if args.split == "test" else "score another split")
            raise RltokError(f"--split {args.split}: {cfg.data.source} has no {args.split} documents here ({hint})")
    from ..rates import requested_rate, schedule_of

    cal_docs = splits.val if args.calibrate_rate else None
    if cal_docs is not None and len(cal_docs) == 0:
        raise RltokError(f"--calibrate-rate calibrates on the validation split, and this run holds out none "
                         f"(data.val_docs={cfg.data.val_docs})")
    # --rate R: a rate-conditioned model runs at R (a rate it was not trained for: refused in one
    # line); with --calibrate-rate the knob then moves until the rate on the validation split is R
    # (a model with a knob and no conditioning: the knob alone takes it there)
    sched = schedule_of(model)
    conditioned = args.rate is not None and (not args.calibrate_rate or (sched is not None and sched.conditioned))
    with requested_rate(model, args.rate if conditioned else None):
        calibration = _calibrate(model, cal_docs, args, args.rate) if args.calibrate_rate else None
        res = evaluate_corpus(model, corpus, cfg.model.seq_len, docs=args.docs, samples=args.samples,
                              mode="greedy" if args.greedy else "sample", batch_size=args.batch_size,
                              seed=args.seed, dtype=args.dtype or cfg.train.dtype, whole=args.whole,
                              stride=args.stride)
    d = {"run": str(args.run), "method": cfg.method, **model.weights, "data": cfg.data.source,
         "split": args.split, **res.to_dict(per_doc=args.per_doc)}
    target = (args.rate or cfg.boundary.target_rate) if cfg.method in RATE_TARGETED else None
    if args.rate is not None:
        d["requested_rate"] = args.rate
    if calibration is not None:
        d["calibration"] = {"on": f"{cfg.data.source} validation split, first 256 documents", **calibration.__dict__}
    off = target is not None and off_target(cfg.method, res.rate, target)
    if target is not None:
        d["target_rate"] = target
    other = None
    if args.against is not None:
        from ..evaluate import paired_difference

        model2 = load_model(args.against, device=args.device)
        d_cal2 = (_calibrate(model2, cal_docs, args, args.rate)
                  if args.calibrate_rate and rate_knob(model2) is not None else None)
        other = evaluate_corpus(model2, corpus, model2.run_config.model.seq_len, docs=args.docs,
                                samples=args.samples, mode="greedy" if args.greedy else "sample",
                                batch_size=args.batch_size, seed=args.seed,
                                dtype=args.dtype or model2.run_config.train.dtype, whole=args.whole,
                                stride=args.stride)
        d["against"] = {"run": str(args.against), "method": model2.run_config.method, **model2.weights,
                        **other.to_dict(per_doc=args.per_doc),
                        "paired": paired_difference(res.per_doc_bpb, other.per_doc_bpb)}
        if d_cal2 is not None:
            d["against"]["calibration"] = {"on": f"{cfg.data.source} validation split, first 256 documents",
                                           **d_cal2.__dict__}
    if args.json:
        print(json.dumps(d))
    else:
        scope = "whole documents" if args.whole else f"first {cfg.model.seq_len} bytes of each document"
        print(f"{args.run} ({cfg.method}) on {cfg.data.source} [{args.split}]: {res.docs} documents, "
              f"{res.bytes:,} bytes ({scope})")
        print(f"  weights       {describe_weights(model)}")
        if calibration is not None:
            print(f"  calibrated    rate knob {calibration.before_value:.4g} -> {calibration.value:.4g}: rate on the "
                  f"validation split {calibration.before_rate:.4f} -> {calibration.rate:.4f}")
        print(f"  bits/byte     {res.bpb:.4f} ± {res.bpb_se:.4f} (mean per document ± SE); corpus {res.corpus_bpb:.4f}")
        print(f"  rate          {res.rate:.4f} boundaries per byte ({res.mode}, {res.samples} sample(s))"
              + (f"; target {target}: off by {res.rate - target:+.3f}" if off else ""))
        print(f"  whitespace    recall {res.whitespace_recall:.3f}  precision {res.whitespace_precision:.3f}"
              f"  (word-start recall {res.word_start_recall:.3f})")
        if other is not None:
            pd = d["against"]["paired"]
            print(f"{args.against} ({d['against']['method']}): bits/byte {other.bpb:.4f} ± {other.bpb_se:.4f}, "
                  f"rate {other.rate:.4f}")
            print(f"  paired difference (this - that): {pd['diff']:+.4f} ± {pd['se']:.4f} bits/byte "
                  f"over {pd['n']} documents (z = {pd['z']:.1f})")
    return 0


def _calibrate(model, corpus, args, rate: float | None = None):
    """The model's rate knob moved to ``rate`` (None: its boundary.target_rate) on ``corpus`` (one
    line where its router has none)."""
    from ..evaluate import calibrate_rate

    cfg = model.run_config
    return calibrate_rate(model, corpus, cfg.model.seq_len, cfg.boundary.target_rate if rate is None else rate,
                          docs=256, batch_size=args.batch_size, dtype=args.dtype or cfg.train.dtype,
                          seed=args.seed)

