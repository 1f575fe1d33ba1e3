"""rltok data: prepare and check training corpora, fetch evaluation data.

Each action is a small ``_add_<action>(actions)`` function listed in ``ACTIONS``; adding one is a
function and a line.
"""

from __future__ import annotations

import json

from . import HelpFormatter, parse_size


def _add_prepare(actions) -> None:
    p = actions.add_parser(
        "prepare", help="stream documents into memory-mapped shards with a split and a manifest",
        description="Read documents from a hub dataset (hf:NAME[:CONFIG], streamed through `datasets`) "
                    "or local parquet/jsonl/json/txt files, keep those of at least --min-bytes bytes, drop "
                    "exact duplicates, split train/val/test deterministically by document and write uint8 "
                    "shards, a document index and manifest.json (sizes, sha256, source, filter). "
                    "Interrupted? Rerun the same command: it resumes. Train on the result with "
                    "`rltok train --data DIR`.",
        epilog="examples: rltok data prepare hf:HuggingFaceFW/fineweb:sample-10BT --out data/fineweb "
               "--max-bytes-total 20G --test-docs 4000 | rltok data prepare 'files/*.parquet' --out data/mine",
        formatter_class=HelpFormatter)
    p.add_argument("source", help="hf:NAME[:CONFIG] (a hub dataset), or a file, directory or glob of "
                                  "parquet/jsonl/json/txt files, or a built-in corpus (stdlib, english, multilingual, multilingual-heldout)")
    p.add_argument("--out", required=True, help="directory to create (or to resume)")
    p.add_argument("--min-bytes", type=int, default=4096,
                   help="keep documents of at least this many bytes (the paper: 4096)")
    p.add_argument("--max-doc-bytes", type=parse_size, default=0,
                   help="cut longer documents into pieces of this size before filtering (0: keep whole)")
    p.add_argument("--truncate-bytes", type=parse_size, default=0,
                   help="store only the first N bytes of each kept document (the paper trains on the "
                        "first 4096; 0: store all)")
    p.add_argument("--max-bytes-total", type=parse_size, default=0,
                   help="stop before the kept bytes exceed this (e.g. 20G; 0: the whole source)")
    p.add_argument("--val-docs", type=int, default=-1, help="validation documents (-1: 10%%, at most 256)")
    p.add_argument("--test-docs", type=int, default=0, help="test documents")
    p.add_argument("--split-seed", type=int, default=1234, help="key of the split hash (as data.split_seed)")
    p.add_argument("--text-field", default="", help="text column (default: 'text', or the known column "
                                                    "of the dataset, e.g. 'content' for CodeParrot)")
    p.add_argument("--hub-split", default="train", help="split of the hub dataset to stream")
    p.add_argument("--data-files", default="", help="data_files for a hub builder (e.g. hf:parquet "
                                                    "--data-files 'part-*.parquet')")
    p.add_argument("--shard-bytes", type=parse_size, default=1 << 28, help="bytes per shard file")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the manifest's counts as JSON")
    p.set_defaults(func=_run_prepare)


def _run_prepare(args) -> int:
    from ..data.prepare import PrepareOptions, prepare

    opts = PrepareOptions(source=args.source, out=args.out, min_bytes=args.min_bytes,
                          max_doc_bytes=args.max_doc_bytes, truncate_bytes=args.truncate_bytes,
                          max_bytes_total=args.max_bytes_total,
                          val_docs=args.val_docs, test_docs=args.test_docs, split_seed=args.split_seed,
                          text_field=args.text_field, hub_split=args.hub_split, data_files=args.data_files,
                          shard_bytes=args.shard_bytes)
    res = prepare(opts, progress=not args.no_progress)
    if res.interrupted:
        return 130
    c = res.manifest["counts"]
    if args.json:
        print(json.dumps({"out": str(res.out), "already_done": res.already_done, **c}))
        return 0
    verb = "already prepared" if res.already_done else "prepared"
    print(f"{verb}: {res.out}  {c['documents']:,} documents, {c['bytes']:,} bytes "
          f"(train {c['train_documents']:,} / val {c['val_documents']:,} / test {c['test_documents']:,}; "
          f"dropped {c['dropped_short']:,} short, {c['dropped_duplicate']:,} duplicate); "
          f"train with: rltok train --data {res.out}")
    return 0


def _add_verify(actions) -> None:
    p = actions.add_parser("verify", help="check a prepared corpus against its manifest (sizes, sha256)",
                           description="Recompute the sha256 of every file of a prepared corpus and compare "
                                       "with manifest.json.")
    p.add_argument("dir", help="prepared directory")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_run_verify)


def _run_verify(args) -> int:
    from ..data.prepared import verify_prepared

    m = verify_prepared(args.dir, progress=not args.no_progress)
    print(f"ok: {args.dir}  {len(m['files'])} files, {m['counts']['bytes']:,} document bytes")
    return 0


def _add_fetch_evals(actions) -> None:
    from ..tasks.fetch import register_cli

    register_cli(actions)


ACTIONS = (_add_prepare, _add_verify, _add_fetch_evals)


def register(sub) -> None:
    p = sub.add_parser("data", help="prepare and check training corpora; fetch evaluation data",
                       description="Data at scale: prepare corpora into memory-mapped shards, verify them, "
                                   "fetch the downstream evaluation sets.")
    actions = p.add_subparsers(dest="data_action", metavar="ACTION")
    for add in ACTIONS:
        add(actions)
    p.set_defaults(func=lambda args: p.print_help() or 0)
