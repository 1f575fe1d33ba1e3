"""The ``prose`` corpus (rltok/data/prose.py): Project Gutenberg cleaning, the split by article and
author, the 64-byte segment overlap with training, the near-duplicate drop, the cache and the
``--data prose`` hook. Synthetic folders for the logic; the real text (../shared/data/prose) when
it is there, skipped cleanly when not."""

from __future__ import annotations

import random
import re
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from conftest import SHARED_DATA, shared_file
from rltok.data import load_splits
from rltok.data import prose
from rltok.data.corpus import Corpus
from rltok.data.prose import (ProseSpec, book_text, build_prose, segments_in, strip_gutenberg,
                              unwrap_paragraphs, wiki_articles)
from rltok.errors import RltokError

# -- Project Gutenberg cleaning --------------------------------------------------------------------

PARAGRAPH = ("It was the best of times, it was the worst of times, it was the age of wisdom, it was the "
             "age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was "
             "the season of Light, it was the season of Darkness, it was the spring of hope.")
DIALOGUE = ("\u201cWhat a strange thing to say,\u201d she answered, turning away from the window where "
            "the rain was falling.")
VERSE = ("Tyger Tyger, burning bright,\nIn the forests of the night;\nWhat immortal hand or eye,\n"
         "Could frame thy fearful symmetry?")


def _crlf(text: str) -> bytes:
    return text.replace("\n", "\r\n").encode()


def _fake_book(body: str, title: str = "Tales", author: str = "Jane Doe", translator: str = "") -> bytes:
    tr = f"Translator: {translator}\n\n" if translator else ""
    return _crlf(
        f"The Project Gutenberg EBook of {title}, by {author}\n\n"
        "This eBook is for the use of anyone anywhere at no cost and with\n"
        "almost no restrictions whatsoever.  You may copy it, give it away or\n"
        "re-use it under the terms of the Project Gutenberg License included\n\n"
        f"Title: {title}\n\nAuthor: {author}\n\n{tr}Release Date: May 1, 2010 [EBook #12345]\n\n"
        f"*** START OF THIS PROJECT GUTENBERG EBOOK {title.upper()} ***\n\n\n\n"
        "Produced by Some Volunteers and the Online Distributed\n"
        "Proofreading Team at http://www.pgdp.net\n\n\n\n"
        f"{body}\n\n\n\n"
        f"End of the Project Gutenberg EBook of {title}, by {author}\n\n"
        f"*** END OF THIS PROJECT GUTENBERG EBOOK {title.upper()} ***\n\n"
        "***** This file should be named 12345.txt or 12345.zip *****\n"
        "Updated editions will replace the previous one--the old editions\nwill be renamed.\n\n"
        "START: FULL LICENSE\n\nTHE FULL PROJECT GUTENBERG LICENSE\n"
        "PLEASE READ THIS BEFORE YOU DISTRIBUTE OR USE THIS WORK\n")


def _hand_body() -> str:
    return ("CHAPTER I.\n\n\n" + textwrap.fill(PARAGRAPH, 70) + "\n\n" + textwrap.fill(DIALOGUE, 70)
            + "\n\n" + "\n".join("  " + ln for ln in VERSE.split("\n")) + "\n")


def test_hand_body_is_hard_wrapped():
    lines = _hand_body().split("\n")
    assert len(textwrap.fill(PARAGRAPH, 70).split("\n")) == 4 and max(map(len, lines)) <= 70


def test_book_text_strips_header_footer_crlf_and_unwraps():
    raw = _fake_book(_hand_body())
    assert b"\r\n" in raw
    expected = "CHAPTER I.\n\n" + PARAGRAPH + "\n\n" + DIALOGUE + "\n\n" + VERSE + "\n"
    assert book_text(raw).decode() == expected


def test_unwrap_keeps_verse_and_headings_joins_wrapped_prose():
    text = (_hand_body() + "\n\n").encode()
    assert unwrap_paragraphs(text) == [b"CHAPTER I.", PARAGRAPH.encode(), DIALOGUE.encode(), VERSE.encode()]


def test_strip_gutenberg_old_small_print_and_split_start_line():
    old = _crlf("Project Gutenberg Etext of Henry V, by Shakespeare\n\n"
                "Copyright laws are changing all over the world, be sure to check\n\n"
                "***START**THE SMALL PRINT!**FOR PUBLIC DOMAIN ETEXTS**START***\n"
                "Why is this \"Small Print!\" statement here? You know: lawyers.\n\n"
                "*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\n\n\n"
                "Enter Chorus.\n\nO For a Muse of Fire, that would ascend\n\n\n"
                "End of Project Gutenberg Etext of Henry V, by Shakespeare\n")
    assert strip_gutenberg(old) == b"Enter Chorus.\n\nO For a Muse of Fire, that would ascend\n"
    two_lines = _crlf("Title: Works\n\n***START OF THE PROJECT GUTENBERG EBOOK THE WORKS OF GUY DE MAUPASSANT,\n"
                      "VOLUME II (OF 8)***\n\n\nE-text prepared by Juliet Sutherland and the Project Gutenberg\n"
                      "Online Distributed Proofreading Team (http://www.pgdp.net/)\n\n\nMONSIEUR PARENT\n\n"
                      "***END OF THE PROJECT GUTENBERG EBOOK THE WORKS\n\nlicence\n")
    assert strip_gutenberg(two_lines) == b"MONSIEUR PARENT\n"


def test_pack_cuts_at_paragraph_boundaries():
    paras = [b"a" * 30, b"b" * 50, b"c" * 10, b"d" * 250, b"e" * 5]
    pieces = prose.pack(paras, 100)
    # 30 + 2 + 50 + 2 + 10 + 1 = 95 bytes fit; the 250-byte paragraph is cut in 99 + 99 + 52
    assert pieces == [b"a" * 30 + b"\n\n" + b"b" * 50 + b"\n\n" + b"c" * 10 + b"\n", b"d" * 99 + b"\n",
                      b"d" * 99 + b"\n", b"d" * 52 + b"\n\n" + b"e" * 5 + b"\n"]
    assert all(len(p) <= 100 and p.endswith(b"\n") for p in pieces)
    assert b"".join(p.rstrip(b"\n") for p in pieces).replace(b"\n", b"") == b"".join(paras)  # nothing lost


def test_surnames_join_authors_and_translators():
    books = [prose.Book("Tolstoy, Leo, graf/A Letter.txt", Path("a"), "Tolstoy, Leo, graf", ["Leo Tolstoy"]),
             prose.Book("Maude, Aylmer/War and Peace.txt", Path("b"), "Maude, Aylmer",
                        ["Leo Tolstoy", "Louise and Aylmer Maude"]),
             prose.Book("Maude, Louise/Resurrection.txt", Path("c"), "Maude, Louise", ["Count Lyof N. Tolstoi"]),
             prose.Book("Trollope, Anthony/Stories.txt", Path("d"), "Trollope, Anthony", ["Various"]),
             prose.Book("Shaw, Bernard/Essays.txt", Path("e"), "Shaw, Bernard", ["Various"])]
    prose.group_authors(books)
    assert {b.group for b in books[:3]} == {"Maude, Aylmer"}
    assert books[3].group == "Trollope, Anthony" and books[4].group == "Shaw, Bernard"  # "Various" joins nobody


def test_wiki_articles_drop_stubs_and_clean_markup():
    text = (b'<doc id="1" url="?curid=1" title="Stub">\nStub\n\n\n</doc>\n'
            b'<doc id="2" url="?curid=2" title="A &amp; B">\nA &amp; B\n\nA &amp; B is a firm.&lt;ref name="x"&gt;'
            b'cite&lt;/ref&gt; It was founded in 1900.&lt;br&gt;History.\nIt grew.\n\n</doc>\n')
    expected = b"A & B\n\nA & B is a firm. It was founded in 1900. History.\nIt grew.\n"
    assert list(wiki_articles(text)) == [("2", expected)]


# -- 64-byte segments in training ------------------------------------------------------------------

def _seg(word: str) -> bytes:
    s = (word + " ") * (64 // (len(word) + 1) + 1)
    return s[:64].encode()


def test_segments_in_hand_worked():
    s0, s1, s2, s3 = _seg("alpha"), _seg("bravo"), _seg("charlie"), _seg("delta")
    train = Corpus.from_docs([b"x" * 10 + s1 + b"y" * 7,   # s1 at an unaligned offset: found
                              b"zz" + s2[:30], s2[30:] + b"zz",  # s2 only across a document end: not found
                              s3[1:]])                          # s3 less its first byte: not found
    other = Corpus.from_docs([s0 + s1 + s2 + s3 + b"a tail under 64 bytes"])
    assert segments_in(train, other) == pytest.approx(1 / 4)
    # every occurrence counts: a second document made of s1 twice
    other2 = Corpus.from_docs([s0 + s1 + s2 + s3, s1 + s1])
    assert segments_in(train, other2) == pytest.approx(3 / 6)
    # segments are aligned in `other`: s1 at offset 5 is not one of its segments
    assert segments_in(train, Corpus.from_docs([b"12345" + s1 + b"x" * 59])) == 0.0
    assert segments_in(train, Corpus.from_docs([b"short"])) == 0.0


def test_segments_in_matches_brute_force(monkeypatch):
    monkeypatch.setattr(prose, "_CHUNK", 1000)  # many chunks, windows straddling them
    rng = random.Random(7)
    alphabet = b"ab "
    train_docs = [bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 900))) for _ in range(12)]
    other_docs = []
    for _ in range(15):
        d = bytearray(rng.choice(alphabet) for _ in range(rng.randrange(0, 500)))
        src = rng.choice(train_docs)
        if len(src) >= 64 and len(d) >= 64:  # plant a training window at an aligned position
            a, j = rng.randrange(len(src) - 63), 64 * rng.randrange(len(d) // 64)
            d[j:j + 64] = src[a:a + 64]
        other_docs.append(bytes(d))
    windows = {d[i:i + 64] for d in train_docs for i in range(len(d) - 63)}
    segs = [d[i:i + 64] for d in other_docs for i in range(0, len(d) - 63, 64)]
    expected = sum(s in windows for s in segs) / len(segs)
    assert 0 < expected < 1
    assert segments_in(Corpus.from_docs(train_docs), Corpus.from_docs(other_docs)) == pytest.approx(expected)


# -- the split, on a synthetic prose folder ----------------------------------------------------------

WORDS = [f"w{i}{c}" for i in range(200) for c in "xyz"]
SMALL = ProseSpec(test_wiki=6, val_wiki=4, test_books=6, val_books=3, test_groups=2, val_groups=1,
                  heldout_piece_bytes=1500, heldout_piece_min=300, train_piece_bytes=3000, pool_factor=3)
# author folder -> (header author, translator) per book; the Maude folders are Tolstoy's group
AUTHORS = {"Tolstoy, Leo": [("Leo Tolstoy", ""), ("Leo Tolstoy", "")],
           "Maude, Aylmer": [("Leo Tolstoy", "Louise and Aylmer Maude")],
           "Maude, Louise": [("Lyof Tolstoi", "")],
           **{f"{name}, Anna": [(f"Anna {name}", ""), (f"Anna {name}", "")]
              for name in ("Abbot", "Baker", "Carter", "Dalton", "Ellis", "Fisher", "Grant")}}


def _sentence(rng: random.Random, marker: str) -> str:
    return " ".join([marker] + [rng.choice(WORDS) for _ in range(rng.randrange(12, 30))]) + "."


def make_prose_folder(root: Path, seed: int = 0) -> dict:
    """A prose folder: 100 Wikipedia articles (20 of them twins of others: the same body under
    another page id), 20 title-only stubs, and 17 books by 10 author folders (9 author groups).
    Every article's title and every book paragraph carries its unit's marker."""
    rng = random.Random(seed)
    (root / "wikipedia_en").mkdir(parents=True)
    (root / "gutenberg").mkdir()
    bodies = {}
    blocks = []
    for i in range(80):
        pid = str(5000 + i)
        bodies[pid] = "\n".join(_sentence(rng, f"wiki{pid}") for _ in range(rng.randrange(3, 9)))
        if i < 20:
            bodies[str(9000 + i)] = bodies[pid]  # a twin: a near-duplicate under another id
    for pid, body in bodies.items():
        blocks.append(f'<doc id="{pid}" url="?curid={pid}" title="Article {pid}">\nArticle {pid}\n\n{body}\n\n</doc>\n')
    for i in range(20):
        blocks.append(f'<doc id="{7000 + i}" url="?curid={7000 + i}" title="Stub {i}">\nStub {i}\n\n\n</doc>\n')
    rng.shuffle(blocks)
    half = len(blocks) // 2
    (root / "wikipedia_en" / "wiki_00").write_text("".join(blocks[:half]))
    (root / "wikipedia_en" / "wiki_01").write_text("".join(blocks[half:]))
    manifest, books = [], {}
    n = 0
    for folder, entries in AUTHORS.items():
        for author, translator in entries:
            blob = f"{n:040x}"
            tag = f"book{n:02d}"
            paras = [textwrap.fill(" ".join(_sentence(rng, tag) for _ in range(rng.randrange(2, 5))), 70)
                     for _ in range(rng.randrange(25, 40))]
            raw = _fake_book("\n\n".join(paras), title=f"Title {n}", author=author, translator=translator)
            (root / "gutenberg" / f"{blob}.txt").write_bytes(raw)
            manifest.append(f"{blob}\t{len(raw)}\t{folder}/Title {n}.txt\n")
            books[tag] = "Tolstoy" if folder in ("Tolstoy, Leo", "Maude, Aylmer", "Maude, Louise") else folder
            n += 1
    (root / "gutenberg" / "MANIFEST.tsv").write_text("".join(manifest))
    return {"articles": bodies, "books": books}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("prose")
    return root, make_prose_folder(root)


@pytest.fixture(scope="module")
def built(folder):
    return build_prose(folder[0], 1234, SMALL)


def _markers(docs: list[bytes], pattern: bytes) -> set[bytes]:
    return {m for d in docs for m in re.findall(pattern, d)}


def test_split_sizes_and_sources(built):
    s = built.stats["splits"]
    assert (s["test"]["wikipedia"]["docs"], s["test"]["gutenberg"]["docs"]) == (6, 6)
    assert (s["val"]["wikipedia"]["docs"], s["val"]["gutenberg"]["docs"]) == (4, 3)
    assert s["train"]["wikipedia"]["docs"] > 50 and s["train"]["gutenberg"]["docs"] > 10
    for name, docs in built.docs.items():
        assert all(d.strip() for d in docs)
        src = built.sources[name]
        assert len(src) == len(docs)
        assert all((d.startswith(b"Article ")) == (k == 0) for d, k in zip(docs, src))
    assert not any(b"Stub" in d for docs in built.docs.values() for d in docs)  # title-only articles dropped
    assert not any(b"GUTENBERG" in d.upper() or b"\r" in d for docs in built.docs.values() for d in docs)


def test_no_unit_in_two_splits(built, folder):
    _, made = folder
    where: dict[bytes, set[str]] = {}
    for name, docs in built.docs.items():
        for m in _markers(docs, rb"Article \d+\n|book\d\d"):
            where.setdefault(m, set()).add(name)
    assert all(len(v) == 1 for v in where.values()), {k: v for k, v in where.items() if len(v) > 1}
    # authors: every book of an author group in one split; the Tolstoy group's four folders together
    by_group: dict[str, set[str]] = {}
    for tag, group in made["books"].items():
        by_group.setdefault(group, set()).update(where.get(tag.encode(), set()))
    assert all(len(v) == 1 for v in by_group.values()), by_group
    held = {g for g, v in by_group.items() if v & {"val", "test"}}
    assert len(held) == SMALL.test_groups + SMALL.val_groups
    # a held-out book is cut into pieces after the split, at paragraph boundaries
    pieces = [d for d, k in zip(built.docs["test"], built.sources["test"]) if k == 1]
    assert all(SMALL.heldout_piece_min <= len(d) <= SMALL.heldout_piece_bytes for d in pieces)
    assert all(d.endswith(b".\n") for d in pieces)


def test_splits_are_shuffled(built):
    for name in ("train", "test"):  # a prefix of any split mixes the sources
        src = built.sources[name]
        first, second = src[: len(src) // 2], src[len(src) // 2:]
        assert 0 < first.mean() < 1 and 0 < second.mean() < 1, name


def test_near_duplicates_dropped(folder, built):
    root, _ = folder
    dropped = built.stats["dedup"]["dropped"]
    assert dropped["test"]["wikipedia"] + dropped["val"]["wikipedia"] > 0
    train, test = Corpus.from_docs(built.docs["train"]), Corpus.from_docs(built.docs["test"])
    assert segments_in(train, test) == pytest.approx(built.stats["leakage"]["test_segments_in_train"]) == 0.0
    # without the drop, twins of training articles reach the test split, and the build refuses it
    with pytest.raises(RltokError, match=r"\d+\.\d\d% of the test split's 64-byte segments occur in training"):
        build_prose(root, 1234, replace(SMALL, dup_threshold=1.0))


def test_split_depends_on_split_seed(folder, built):
    other = build_prose(folder[0], 99, SMALL)
    assert set(other.docs["test"]) != set(built.docs["test"])
    assert build_prose(folder[0], 1234, SMALL).docs == built.docs  # and only on it


# -- the hook: --data prose, the cache, data.val_docs / test_docs ---------------------------------------

@pytest.fixture
def prose_env(folder, tmp_path, monkeypatch):
    monkeypatch.setenv("RLTOK_PROSE_DIR", str(folder[0]))
    monkeypatch.setenv("RLTOK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(prose, "SPEC", SMALL)
    return folder[0], tmp_path / "cache"


def _cfg(**data):
    from rltok.config import build_config

    return build_config("uniform", "tiny",
                        overrides={"data.source": "prose", **{f"data.{k}": v for k, v in data.items()}})


def test_load_splits_prose_and_cache(prose_env, built):
    root, cache = prose_env
    splits = load_splits(_cfg())
    sizes = [len(splits.train), len(splits.val), len(splits.test)]
    assert sizes == [len(built.docs[k]) for k in ("train", "val", "test")]
    assert [splits.test.doc_bytes(i) for i in range(len(splits.test))] == built.docs["test"]
    cached = [p for p in cache.glob("prose-v1-s1234-*") if p.is_dir()]
    assert len(cached) == 1 and (cached[0] / "stats.json").is_file()
    assert isinstance(splits.train.data, np.memmap)  # memory-mapped from the cache
    t0 = time.time()
    again = load_splits(_cfg())
    assert time.time() - t0 < 2 and again.train.total_bytes == splits.train.total_bytes
    # a path to the folder is the same source
    by_path = load_splits(_cfg(source=str(root)))
    assert by_path.test.total_bytes == splits.test.total_bytes
    # the training loader reads it
    from rltok.data.loader import SequenceDataset

    batch = SequenceDataset(splits.train, 512, seed=0).batch(np.arange(4))
    assert tuple(batch.ids.shape) == (4, 512)


def test_val_test_docs_cap_and_min_doc_bytes(prose_env):
    s = load_splits(_cfg(test_docs=5, val_docs=0, min_doc_bytes=2000))
    full = load_splits(_cfg())
    assert len(s.test) == 5 and len(s.val) == 0
    assert [s.test.doc_bytes(i) for i in range(5)] == [full.test.doc_bytes(i) for i in range(5)]
    assert s.test.total_bytes == sum(len(full.test.doc_bytes(i)) for i in range(5))
    assert len(s.train) < len(full.train) and s.train.lengths.min() >= 2000
    with pytest.raises(RltokError, match="test split holds 12 documents"):
        load_splits(_cfg(test_docs=13))


def test_load_corpus_prose_is_all_splits(prose_env):
    from rltok.data.sources import load_corpus

    full = load_splits(_cfg())
    every = load_corpus("prose")
    assert len(every) == len(full.train) + len(full.val) + len(full.test)
    assert every.doc_bytes(len(every) - 1) == full.test.doc_bytes(len(full.test) - 1)


def test_prepare_refuses_prose(prose_env):
    from rltok.data.prepare import local_files

    with pytest.raises(RltokError, match="not prepared"):
        local_files(str(prose_env[0]))


def test_missing_data_is_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("RLTOK_PROSE_DIR", raising=False)
    monkeypatch.setenv("RLTOK_SHARED_DATA", str(tmp_path / "shared"))
    monkeypatch.setattr(prose, "_repo_root", lambda: tmp_path / "repo")
    with pytest.raises(RltokError) as e:
        load_splits(_cfg())
    msg = str(e.value)
    assert "RLTOK_PROSE_DIR" in msg and str(tmp_path / "shared" / "prose") in msg and "\n" not in msg
    assert str(tmp_path / "shared" / "data" / "prose") in msg  # <repo>/../shared/data/prose
    monkeypatch.setenv("RLTOK_PROSE_DIR", str(tmp_path / "nowhere"))  # set and wrong: no fallback
    with pytest.raises(RltokError, match="RLTOK_PROSE_DIR=.*nowhere is not a prose folder"):
        load_splits(_cfg())


# -- the real text ------------------------------------------------------------------------------------

REAL_SMALL = ProseSpec(test_wiki=100, val_wiki=40, test_books=30, val_books=10, test_groups=3, val_groups=2,
                       max_wiki_files=2, max_books=24)


def test_real_subset():
    shared_file("prose", "gutenberg", "MANIFEST.tsv")
    shared_file("prose", "wikipedia_en", "wiki_00")
    b = build_prose(SHARED_DATA / "prose", 1234, REAL_SMALL)
    s = b.stats["splits"]
    assert s["test"]["wikipedia"]["docs"] == 100 and s["test"]["gutenberg"]["docs"] == 30
    train, test = Corpus.from_docs(b.docs["train"]), Corpus.from_docs(b.docs["test"])
    assert segments_in(train, test) == pytest.approx(b.stats["leakage"]["test_segments_in_train"])
    assert b.stats["leakage"]["test_segments_in_train"] < 0.005
    for docs in b.docs.values():
        for d in docs:
            assert b"\r" not in d and b"\n\n\n" not in d
            assert not re.search(rb"\*\*\* ?(START|END) OF TH|SMALL PRINT|Project Gutenberg(-tm)? License", d, re.I)
    # unwrapped: book paragraphs are long lines, not ~70-character ones
    book = b"\n".join(d for d, k in zip(b.docs["train"], b.sources["train"]) if k == 1)
    lines = [ln for ln in book.split(b"\n") if ln]
    assert np.mean([len(ln) > 100 for ln in lines]) > 0.3


@pytest.mark.slow
def test_real_full_splits(tmp_path, monkeypatch):
    root = shared_file("prose")
    monkeypatch.setenv("RLTOK_CACHE", str(tmp_path))
    splits, sources, stats = prose.open_prose(root.resolve(), 1234)
    assert len(splits.test) >= 1000 and len(splits.val) >= 256
    for name in ("val", "test"):
        counts = np.bincount(sources[name], minlength=2)
        assert counts.min() >= 0.1 * counts.sum(), (name, counts)  # both sources
    assert stats["leakage"]["test_segments_in_train"] < 0.005
    assert segments_in(splits.train, splits.test) == pytest.approx(stats["leakage"]["test_segments_in_train"])
    t0 = time.time()
    prose.open_prose(root.resolve(), 1234)
    assert time.time() - t0 < 5
