"""`rltok data prepare`: shards, index, manifest, the split rule, resumption, hub errors."""

import json

import numpy as np
import pytest
import torch

from rltok.cli import main
from rltok.schema import DataConfig
from rltok.data import load_splits
from rltok.data.corpus import split_corpus
from rltok.data.loader import SequenceDataset
from rltok.data.prepare import PrepareOptions, iter_hub, iter_local, prepare
from rltok.data.prepared import ShardedBytes, open_all, open_prepared, verify_prepared
from rltok.data.sources import load_corpus
from rltok.errors import RltokError


def _docs(corpus):
    return [corpus.doc_bytes(i) for i in range(len(corpus))]


def _parquet_files(tmp_path, c4_path, n_files=3):
    """Real C4 documents written to several parquet files (with a duplicate and a null)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [json.loads(line)["text"] for line in c4_path.read_text().splitlines()[:300]]
    texts.insert(50, max(texts[:50], key=len))  # an exact duplicate, dropped
    d = tmp_path / "pq"
    d.mkdir()
    per = -(-len(texts) // n_files)
    for k in range(n_files):
        part = texts[k * per:(k + 1) * per]
        if k == 1:
            part = part[:5] + [None] + part[5:]
        pq.write_table(pa.table({"text": part, "id": list(range(len(part)))}), d / f"part-{k}.parquet")
    return d


def test_c4_sample_prepares_and_splits_like_the_direct_reader(c4_path, tmp_path):
    out = tmp_path / "c4"
    res = prepare(PrepareOptions(str(c4_path), str(out), min_bytes=4096, val_docs=16, test_docs=8),
                  progress=False)
    m = res.manifest
    assert m["counts"]["documents"] == 130 and m["counts"]["source_documents_read"] == 1000
    assert m["counts"]["dropped_short"] == 870
    assert (m["counts"]["train_documents"], m["counts"]["val_documents"], m["counts"]["test_documents"]) == (106, 16, 8)
    assert m["source"]["kind"] == "files" and m["source"]["files"][0]["size"] == c4_path.stat().st_size
    assert verify_prepared(out)["counts"] == m["counts"]
    assert not (out / ".progress").exists()
    # the same files read directly and split by split_corpus give the same splits, in the same order
    cfg = DataConfig(min_doc_bytes=4096, max_doc_bytes=1 << 30, val_docs=16, test_docs=8)
    direct = split_corpus(load_corpus(str(c4_path), cfg), cfg)
    prepared = open_prepared(out)
    for s in ("train", "val", "test"):
        assert _docs(getattr(prepared, s)) == _docs(getattr(direct, s)), s
    assert all(len(d) >= 4096 for d in _docs(prepared.train))


def test_local_parquet_shards_match_the_direct_reader(c4_path, tmp_path):
    src = _parquet_files(tmp_path, c4_path)
    out = tmp_path / "prep"
    res = prepare(PrepareOptions(str(src), str(out), min_bytes=500, val_docs=10, test_docs=5,
                                 shard_bytes=100_000), progress=False)
    m = res.manifest
    assert m["counts"]["dropped_duplicate"] == 1
    assert len(m["shards"]) > 3  # several shards, no document straddles two
    assert all(s["size"] <= 100_000 for s in m["shards"][:-1])
    cfg = DataConfig(min_doc_bytes=500, max_doc_bytes=1 << 30, val_docs=10, test_docs=5)
    direct = split_corpus(load_corpus(str(src), cfg), cfg)
    splits = load_splits(type("C", (), {"data": DataConfig(source=str(out))})())
    for s in ("train", "val", "test"):
        assert _docs(getattr(splits, s)) == _docs(getattr(direct, s)), s
    # memory-mapped, not loaded
    assert isinstance(splits.train.data, ShardedBytes)
    # training sequences from the shards equal those from the in-memory corpus (stream packing
    # gathers across document and shard boundaries)
    a = SequenceDataset(splits.train, 256, seed=5)
    b = SequenceDataset(direct.train, 256, seed=5)
    idx = np.arange(0, 40)
    ba, bb = a.batch(idx), b.batch(idx)
    assert torch.equal(ba.ids, bb.ids) and torch.equal(ba.targets, bb.targets)
    da = SequenceDataset(splits.train, 256, seed=5, packing="document").batch(idx)
    db = SequenceDataset(direct.train, 256, seed=5, packing="document").batch(idx)
    assert torch.equal(da.ids, db.ids)
    # all documents, in source order, for `rltok eval --split all`
    everything = _docs(load_corpus(str(src), cfg))
    assert _docs(load_corpus(str(out))) == list(dict.fromkeys(everything))  # first copy kept


def test_sharded_bytes_indexing(tmp_path):
    parts = [b"abc", b"", b"defgh", b"ij"]
    paths = []
    for k, p in enumerate(parts):
        paths.append(tmp_path / f"s{k}")
        paths[-1].write_bytes(p)
    sb = ShardedBytes(paths, [len(p) for p in parts])
    whole = np.frombuffer(b"".join(parts), dtype=np.uint8)
    assert len(sb) == 10
    for lo in range(11):
        for hi in range(lo, 11):
            assert bytes(sb[lo:hi]) == bytes(whole[lo:hi]), (lo, hi)
    idx = np.array([9, 0, 3, 7, 2, 8, 4])
    assert np.array_equal(sb[idx], whole[idx])
    assert sb[5] == whole[5] and sb[-1] == whole[-1]


def test_interrupted_prepare_resumes_to_identical_files(c4_path, tmp_path):
    src = _parquet_files(tmp_path, c4_path)
    kw = dict(min_bytes=300, val_docs=8, test_docs=4, shard_bytes=60_000, commit_docs=7)
    ref = prepare(PrepareOptions(str(src), str(tmp_path / "ref"), **kw), progress=False).manifest
    out = tmp_path / "resumed"
    first = prepare(PrepareOptions(str(src), str(out), **kw), progress=False, stop_after_docs=40)
    assert first.interrupted and not (out / "manifest.json").exists()
    state = json.loads((out / ".progress" / "state.json").read_text())
    assert state["source_pos"] == 40
    # a crash after the last commit leaves bytes the state does not know: they are discarded
    with open(out / state["shards"][-1]["path"], "ab") as f:
        f.write(b"garbage written after the last commit")
    with open(out / ".progress" / "key.bin", "ab") as f:
        f.write(b"\x01" * 12)
    second = prepare(PrepareOptions(str(src), str(out), **kw), progress=False, stop_after_docs=100)
    assert second.interrupted and second.resumed
    third = prepare(PrepareOptions(str(src), str(out), **kw), progress=False)
    assert third.resumed and not third.interrupted
    assert third.manifest["files"] == ref["files"]
    assert third.manifest["counts"] == ref["counts"]
    # rerunning a finished preparation is a no-op; other options are refused
    assert prepare(PrepareOptions(str(src), str(out), **kw), progress=False).already_done
    with pytest.raises(RltokError, match="other options.*min_bytes"):
        prepare(PrepareOptions(str(src), str(out), **{**kw, "min_bytes": 10}), progress=False)


def test_resume_with_other_options_and_unrelated_directories_are_refused(c4_path, tmp_path):
    out = tmp_path / "o"
    prepare(PrepareOptions(str(c4_path), str(out), min_bytes=100, val_docs=4), progress=False,
            stop_after_docs=10)
    with pytest.raises(RltokError, match="interrupted preparation with other options.*val_docs"):
        prepare(PrepareOptions(str(c4_path), str(out), min_bytes=100, val_docs=5), progress=False)
    other = tmp_path / "busy"
    other.mkdir()
    (other / "x.txt").write_text("mine")
    with pytest.raises(RltokError, match="not an interrupted preparation"):
        prepare(PrepareOptions(str(c4_path), str(other)), progress=False)


def test_limits_and_too_few_documents(c4_path, tmp_path):
    m = prepare(PrepareOptions(str(c4_path), str(tmp_path / "a"), min_bytes=1000, val_docs=4,
                               max_bytes_total=300_000), progress=False).manifest
    assert m["limit"]["reached"] and 290_000 < m["counts"]["bytes"] <= 300_000
    # the paper's storage: the filter sees whole documents, only the first 4096 bytes are kept
    out = tmp_path / "t"
    m = prepare(PrepareOptions(str(c4_path), str(out), min_bytes=4097, truncate_bytes=4096, val_docs=4),
                progress=False).manifest
    full = [d for _, d in iter_local(str(c4_path), "text") if len(d) >= 4097]
    assert m["counts"]["documents"] == len(full) and m["counts"]["bytes"] == 4096 * len(full)
    assert _docs(open_all(out)) == [d[:4096] for d in full]
    with pytest.raises(RltokError, match="too few for 200 validation"):
        prepare(PrepareOptions(str(c4_path), str(tmp_path / "b"), min_bytes=4096, val_docs=200),
                progress=False)


def test_corrupted_or_truncated_prepared_corpus_is_reported(c4_path, tmp_path):
    out = tmp_path / "c"
    prepare(PrepareOptions(str(c4_path), str(out), min_bytes=4096, val_docs=4), progress=False)
    shard = out / "shards" / "shard-00000.u8"
    raw = bytearray(shard.read_bytes())
    raw[100] ^= 1
    shard.write_bytes(bytes(raw))
    with pytest.raises(RltokError, match="sha256 differs"):
        verify_prepared(out)
    shard.write_bytes(bytes(raw[:-10]))
    with pytest.raises(RltokError, match="shard-00000.u8: size .* differs"):
        open_prepared(out)


def test_hub_streaming_path_reads_like_local_files(c4_path, tmp_path):
    """The `datasets` streaming path (a packaged builder on local files: no network) yields the
    same documents as the local reader, and resumes by skipping."""
    pytest.importorskip("datasets")
    src = _parquet_files(tmp_path, c4_path)
    files = sorted(str(p) for p in src.glob("*.parquet"))
    hub = [d for _, d in iter_hub("hf:parquet", "text", data_files=files)]
    local = [d for _, d in iter_local(str(src), "text")]
    assert hub == local and len(hub) == 301
    assert [n for n, _ in iter_hub("hf:parquet", "text", data_files=files, skip=250)][:2] == [250, 251]
    with pytest.raises(RltokError, match="no 'body' field"):
        next(iter_hub("hf:parquet", "body", data_files=files))


def test_hub_unreachable_is_a_quick_clear_error(capsys, tmp_path, monkeypatch):
    import time

    pytest.importorskip("datasets")
    for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")  # .invalid never resolves
    t = time.perf_counter()
    code = main(["data", "prepare", "hf:HuggingFaceFW/fineweb:sample-10BT", "--out", str(tmp_path / "f"),
                 "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines()[-1].startswith("error: no network")
    assert "pass local files" in err and "Traceback" not in err
    assert time.perf_counter() - t < 15


def test_cli_prepare_and_verify(capsys, c4_path, tmp_path):
    out = tmp_path / "cli"
    code = main(["data", "prepare", str(c4_path), "--out", str(out), "--min-bytes", "4096",
                 "--val-docs", "8", "--no-progress", "--json"])
    res = json.loads(capsys.readouterr().out)
    assert code == 0 and res["documents"] == 130 and res["val_documents"] == 8
    assert main(["data", "verify", str(out), "--no-progress"]) == 0
    assert capsys.readouterr().out.startswith("ok: ")
    code = main(["data", "prepare", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "m")])
    err = capsys.readouterr().err
    assert code == 2 and "missing.jsonl" in err.strip().splitlines()[-1]
    assert not (tmp_path / "m").exists()
    assert open_all(out).total_bytes == res["bytes"]
