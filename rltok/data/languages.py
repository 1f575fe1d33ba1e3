"""The language of each document, and temperature sampling of languages for training (issue 16).

A multilingual corpus is dominated by its largest languages. Temperature sampling (as in mBERT
and XLM-R) trains on language l with probability q_l proportional to p_l ** (1 / T), where p_l is
l's share of the training bytes: T = 1 keeps the natural shares, T -> infinity gives every
language the same share. rltok realises q by reweighting the training split (never the held-out
ones): each document of language l appears floor(f_l) times, plus a seeded selection of its
documents for the fractional part, f_l = q_l / p_l, so the split keeps its size in bytes and the
training stream (``data.loader``) needs no change.

Languages are known for the built-in multilingual corpora (``languages.json`` beside the cached
documents); a document cut into pieces (``data.max_doc_bytes``) gives each piece its language.
"""

from __future__ import annotations

import hashlib
from collections import Counter

import numpy as np

from ..schema import DataConfig
from ..errors import RltokError
from .corpus import Corpus
from . import multilingual

# writing system of the languages in the built-in multilingual corpora (ISO 15924)
SCRIPTS = {"ja": "Jpan", "zh-cn": "Hans", "zh-tw": "Hant", "ru": "Cyrl", "uk": "Cyrl", "mk": "Cyrl",
           "sr": "Cyrl", "el": "Grek"}

# FLORES-200 file of each language of the built-in multilingual corpora (FLORES's Portuguese is
# Brazilian; pt and pt-br share it)
FLORES_OF = {"cs": "ces_Latn", "da": "dan_Latn", "de": "deu_Latn", "el": "ell_Grek", "en": "eng_Latn",
             "es": "spa_Latn", "fi": "fin_Latn", "fr": "fra_Latn", "hu": "hun_Latn", "id": "ind_Latn",
             "it": "ita_Latn", "ja": "jpn_Jpan", "mk": "mkd_Cyrl", "nb": "nob_Latn", "nl": "nld_Latn",
             "pl": "pol_Latn", "pt": "por_Latn", "pt-br": "por_Latn", "ro": "ron_Latn", "ru": "rus_Cyrl",
             "sr": "srp_Cyrl", "sv": "swe_Latn", "tr": "tur_Latn", "uk": "ukr_Cyrl", "vi": "vie_Latn",
             "zh-cn": "zho_Hans", "zh-tw": "zho_Hant"}


def script_of(lang: str) -> str:
    return SCRIPTS.get(lang, "Latn")


def _digest(d: bytes) -> bytes:
    return hashlib.sha256(d).digest()


def source_languages(source: str, cfg: DataConfig) -> dict[bytes, str]:
    """sha256 of each document (each piece, as ``normalize_docs`` cuts them) -> its language."""
    if source not in multilingual.NAMES:
        raise RltokError(f"data.language_temperature needs a data source whose documents carry a language "
                         f"({', '.join(multilingual.NAMES)}); {source!r} has none")
    out: dict[bytes, str] = {}
    step = cfg.max_doc_bytes
    for lang, d in zip(multilingual.languages(source), multilingual.docs(source)):
        for i in range(0, max(len(d), 1), step):
            out.setdefault(_digest(d[i:i + step]), lang)
    return out


def corpus_languages(corpus: Corpus, lang_of: dict[bytes, str]) -> list[str]:
    """The language of each document of ``corpus`` ("" where unknown)."""
    return [lang_of.get(_digest(corpus.doc_bytes(i)), "") for i in range(len(corpus))]


def temperature_shares(byte_counts: dict[str, int], temperature: float) -> dict[str, float]:
    """q_l proportional to p_l ** (1 / T)."""
    total = sum(byte_counts.values())
    w = {k: (v / total) ** (1.0 / temperature) for k, v in byte_counts.items() if v > 0}
    z = sum(w.values())
    return {k: v / z for k, v in w.items()}


def reweight(corpus: Corpus, langs: list[str], temperature: float, seed: int = 0) -> Corpus:
    """The documents of ``corpus`` repeated or subsampled per language to the temperature shares
    (module docstring); documents keep their order, a repeated one follows itself."""
    lens = corpus.lengths
    counts = language_bytes(corpus, langs)
    q = temperature_shares(counts, temperature)
    total = sum(counts.values())
    rng = np.random.default_rng([seed, 16])
    copies = np.zeros(len(corpus), dtype=np.int64)
    for lang in sorted(q):
        idx = np.array([i for i, l in enumerate(langs) if l == lang], dtype=np.int64)
        f = q[lang] * total / counts[lang]
        whole, frac = int(f), f - int(f)
        copies[idx] = whole
        # the fractional part: documents in a seeded order until frac of the language's bytes
        order = rng.permutation(idx)
        take = np.cumsum(lens[order]) <= frac * counts[lang] + 0.5 * np.median(lens[idx])
        copies[order[take]] += 1
    docs = [corpus.doc_bytes(i) for i in range(len(corpus)) for _ in range(int(copies[i]))]
    if not docs:
        raise RltokError("data.language_temperature: reweighting left no training documents")
    return Corpus.from_docs(docs, name=corpus.name)


def language_bytes(corpus: Corpus, langs: list[str]) -> dict[str, int]:
    c: Counter = Counter()
    for lang, n in zip(langs, corpus.lengths):
        c[lang] += int(n)
    return dict(sorted(c.items(), key=lambda kv: -kv[1]))
