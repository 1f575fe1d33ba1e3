"""Data: sources and built-in corpora, the document split, training sequences."""

from __future__ import annotations

from pathlib import Path

from ..schema import RunConfig
from .corpus import Corpus, Splits, split_corpus
from .prose import is_prose_source
from .sources import load_corpus


def is_prepared(source: str) -> bool:
    return (Path(source).expanduser() / "manifest.json").is_file()


def load_splits(cfg: RunConfig) -> Splits:
    """Train/validation/test documents of the run's data source."""
    src = cfg.data.source
    if is_prose_source(src):  # split by article and author, not by document hash (rltok/data/prose.py)
        from .prose import load_prose

        splits = load_prose(cfg.data)
    elif is_prepared(src):
        from .prepared import open_prepared

        splits = open_prepared(src)
    else:
        splits = split_corpus(load_corpus(src, cfg.data), cfg.data)
    if cfg.data.language_temperature != 1.0:
        from .languages import corpus_languages, reweight, source_languages

        langs = corpus_languages(splits.train, source_languages(src, cfg.data))
        splits.train = reweight(splits.train, langs, cfg.data.language_temperature, cfg.data.split_seed)
    return splits


__all__ = ["Corpus", "Splits", "load_splits", "load_corpus", "split_corpus", "is_prepared"]
