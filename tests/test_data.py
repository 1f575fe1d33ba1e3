"""Data sources, the document split and the training sequences."""

import gzip
import json

import numpy as np
import pytest

from rltok.schema import BOS, PAD, DataConfig
from rltok.data.corpus import Corpus, split_corpus
from rltok.data.loader import SequenceDataset, document_batches
from rltok.data.sources import load_corpus, read_documents
from rltok.errors import RltokError


def test_formats_all_read(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"plain text \xff\xfe not utf-8")
    (tmp_path / "b.jsonl").write_text('{"text": "one"}\n\n{"text": "two", "x": 1}\n')
    (tmp_path / "c.json").write_text(json.dumps([{"text": "three"}, {"text": "four"}]))
    with gzip.open(tmp_path / "d.jsonl.gz", "wt") as f:
        f.write('{"text": "five"}\n')
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["six", "seven"]}), tmp_path / "e.parquet")
    docs = read_documents(str(tmp_path))
    assert docs == [b"plain text \xff\xfe not utf-8", b"one", b"two", b"three", b"four", b"five", b"six", b"seven"]
    assert read_documents(str(tmp_path / "*.json*")) == [b"one", b"two", b"three", b"four", b"five"]


def test_malformed_jsonl_names_file_and_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"text": "fine"}\n{"text": broken\n')
    with pytest.raises(RltokError, match=r"bad\.jsonl:2: malformed JSON"):
        read_documents(str(p))
    p.write_text('{"text": "fine"}\n{"body": "x"}\n')
    with pytest.raises(RltokError, match=r"bad\.jsonl:2: no 'text' field"):
        read_documents(str(p))
    p.write_text('{"text": 3}\n')
    with pytest.raises(RltokError, match=r"bad\.jsonl:1: field 'text' is int"):
        read_documents(str(p))


def test_missing_and_empty_sources(tmp_path):
    with pytest.raises(RltokError, match="no such file"):
        read_documents(str(tmp_path / "nope.jsonl"))
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(RltokError, match="no documents"):
        read_documents(str(tmp_path / "empty.jsonl"))


def test_truncated_gzip_is_a_clean_error(tmp_path):
    raw = gzip.compress(b'{"text": "hello"}\n' * 100)
    p = tmp_path / "t.jsonl.gz"
    p.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(RltokError, match="t.jsonl.gz: not a valid gzip"):
        read_documents(str(p))


def test_long_documents_are_cut_and_short_dropped():
    cfg = DataConfig(max_doc_bytes=4, min_doc_bytes=2)
    from rltok.data.corpus import normalize_docs

    assert normalize_docs([b"abcdefghij", b"x", b"yz"], cfg) == [b"abcd", b"efgh", b"ij", b"yz"]


def test_split_is_deterministic_disjoint_and_deduplicated():
    docs = [f"document number {i} ".encode() * 3 for i in range(50)] + [b"document number 3 " * 3]
    corpus = Corpus.from_docs(docs, "t")
    a = split_corpus(corpus, DataConfig(val_docs=5, test_docs=3))
    b = split_corpus(Corpus.from_docs(list(docs), "t"), DataConfig(val_docs=5, test_docs=3))
    va = {a.val.doc_bytes(i) for i in range(len(a.val))}
    tr = {a.train.doc_bytes(i) for i in range(len(a.train))}
    te = {a.test.doc_bytes(i) for i in range(len(a.test))}
    assert len(va) == 5 and len(te) == 3 and len(tr) == 42  # 50 distinct documents
    assert not (va & tr) and not (te & tr) and not (va & te)
    assert va == {b.val.doc_bytes(i) for i in range(len(b.val))}
    # a different split seed gives a different split
    c = split_corpus(corpus, DataConfig(val_docs=5, split_seed=99))
    assert {c.val.doc_bytes(i) for i in range(len(c.val))} != va


def test_stream_windows_are_deterministic_and_insert_bos():
    corpus = Corpus.from_docs([b"abc", b"defgh", b"ij"], "t")
    ds = SequenceDataset(corpus, seq_len=4, seed=1)
    # the virtual stream is BOS a b c BOS d e f g h BOS i j (13 ids)
    stream = [BOS, *b"abc", BOS, *b"defgh", BOS, *b"ij"]
    for g in range(10):
        w = ds.ids(g).tolist()
        assert len(w) == 5
        s = "".join(map(chr, [x if x < 256 else 0x2400 for x in w]))
        doubled = "".join(map(chr, [x if x < 256 else 0x2400 for x in stream * 3]))
        assert s in doubled  # every window is a contiguous (cyclic) slice of the stream
        assert np.array_equal(ds.ids(g), SequenceDataset(corpus, 4, 1).ids(g))


def test_batches_do_not_depend_on_world_size():
    corpus = Corpus.from_docs([bytes(range(i, i + 40)) for i in range(20)], "t")
    ds = SequenceDataset(corpus, seq_len=16, seed=3)
    one = ds.batch(ds.step_indices(5, 8, 0, 1))
    r0 = ds.batch(ds.step_indices(5, 8, 0, 2))
    r1 = ds.batch(ds.step_indices(5, 8, 1, 2))
    import torch

    assert torch.equal(one.ids, torch.cat([r0.ids, r1.ids]))
    assert torch.equal(one.noise, torch.cat([r0.noise, r1.noise]))
    assert torch.equal(one.targets[:, :-1], one.ids[:, 1:])


def test_document_packing_pads_and_masks():
    corpus = Corpus.from_docs([b"abcdefgh", b"xy"], "t")
    ds = SequenceDataset(corpus, seq_len=5, seed=0, packing="document")
    b = ds.batch(np.arange(2))
    rows = {tuple(r) for r in b.ids.tolist()}
    assert (BOS, *b"abcd") in rows and (BOS, *b"xy", PAD, PAD) in rows
    i = [r for r in range(2) if b.ids[r, 1] == ord("x")][0]
    assert b.targets[i].tolist() == [*b"xy", -1, -1, -1]


def test_eval_batches_score_exactly_the_document_bytes():
    corpus = Corpus.from_docs([b"hello", b"a"], "t")
    (idx, batch), = list(document_batches(corpus, seq_len=4, batch_size=2))
    assert batch.ids.tolist() == [[BOS, *b"hel"], [BOS, PAD, PAD, PAD]]
    assert batch.targets.tolist() == [[*b"hell"], [ord("a"), -1, -1, -1]]


def test_c4_source_reads(c4_path):
    corpus = load_corpus(str(c4_path))
    assert len(corpus) == 1000 and corpus.total_bytes > 2_000_000
