"""save_pretrained / from_pretrained / push_to_hub with huggingface_hub's conventions, offline:
local directories, a Hub cache read with local_files_only, and the upload seen at HfApi."""

import json
import shutil

import pytest
import torch

import rltok
from rltok.cli import main
from rltok.errors import RltokError

pytest.importorskip("huggingface_hub")


def _same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_round_trip_and_model_card(smoke_runs, tmp_path):
    m = rltok.load(smoke_runs["rl"])
    out = m.save_pretrained(tmp_path / "export")
    assert {p.name for p in out.iterdir()} >= {"config.json", "model.safetensors", "README.md", "summary.json"}
    m2 = type(m).from_pretrained(out)
    assert type(m2) is type(m) and _same_weights(m, m2)
    assert m2.run_config.to_dict() == m.run_config.to_dict()
    assert m2.weights["finished"] is True
    card = (out / "README.md").read_text()
    summary = json.loads((smoke_runs["rl"] / "summary.json").read_text())
    assert card.startswith("---\n") and "library_name: rltok" in card and "method-rl" in card
    assert f"{summary['val_bpb']:.4f}" in card and "final weights of a finished run" in card
    from huggingface_hub import ModelCard

    assert ModelCard.load(out / "README.md").data.library_name == "rltok"  # the card parses


def test_saved_model_is_a_run_for_every_command(smoke_runs, tmp_path, capsys, one_thread):
    out = rltok.load(smoke_runs["rl"]).save_pretrained(tmp_path / "export")
    data = json.loads((out / "config.json").read_text())["data"]["source"]
    assert main(["eval", str(out), "--data", data, "--docs", "2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["checkpoint"] == "model.safetensors" and d["finished"] is True


def test_unfinished_weights_say_so(smoke_runs, tmp_path):
    run = tmp_path / "stopped"
    shutil.copytree(smoke_runs["rl"], run)
    (run / "model.safetensors").unlink()
    (run / "summary.json").unlink()
    m = rltok.load(run)
    out = m.save_pretrained(tmp_path / "export")
    assert not (out / "summary.json").exists()
    assert "had not finished" in (out / "README.md").read_text()
    m2 = rltok.from_pretrained(out)
    assert m2.weights["finished"] is False and _same_weights(m, m2)


def test_method_files_travel_with_the_model(tmp_path, small_corpus_file, one_thread):
    from rltok.config import build_config
    from rltok.train import train

    cfg = build_config("bpe", "smoke", overrides={"data.source": str(small_corpus_file), "train.max_steps": 2,
                                                  "train.eval_docs": 2})
    train(cfg, tmp_path / "bpe", progress=False)
    out = rltok.load(tmp_path / "bpe").save_pretrained(tmp_path / "export")
    assert (out / "tokenizer.json").is_file()
    shutil.rmtree(tmp_path / "bpe")  # the export stands alone
    m = rltok.from_pretrained(out)
    assert m.run_config.method == "bpe"


def _hub_cache(tmp_path, src, repo="someone/tiny-rl"):
    """The layout huggingface_hub keeps in its cache after a download of ``repo``."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    base = tmp_path / "hub" / f"models--{repo.replace('/', '--')}"
    shutil.copytree(src, base / "snapshots" / commit)
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(commit)
    return tmp_path / "hub", repo


def test_from_pretrained_reads_a_hub_repo_from_the_cache(smoke_runs, tmp_path):
    m = rltok.load(smoke_runs["rl"])
    cache, repo = _hub_cache(tmp_path, m.save_pretrained(tmp_path / "export"))
    m2 = rltok.from_pretrained(repo, cache_dir=cache, local_files_only=True)
    assert _same_weights(m, m2)
    with pytest.raises(RltokError, match="not in the Hugging Face cache"):
        rltok.from_pretrained("someone/absent", cache_dir=cache, local_files_only=True)
    with pytest.raises(RltokError, match="neither a local directory nor a valid Hub repo id"):
        rltok.from_pretrained("not//a repo", cache_dir=cache, local_files_only=True)


def test_from_pretrained_of_the_wrong_class_is_one_line(smoke_runs, tmp_path):
    from rltok.flat import FlatLM

    out = rltok.load(smoke_runs["rl"]).save_pretrained(tmp_path / "export")
    with pytest.raises(RltokError, match="not a FlatLM"):
        FlatLM.from_pretrained(out)


def test_push_to_hub_uploads_a_loadable_folder(smoke_runs, tmp_path, monkeypatch):
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoUrl

    seen = {}

    def create_repo(self, repo_id, **kw):
        seen["create"] = (repo_id, kw)
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, *, repo_id, folder_path, **kw):
        seen["upload"] = (repo_id, kw)
        shutil.copytree(folder_path, tmp_path / "uploaded")  # what would reach the Hub
        return "commit"

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    m = rltok.load(smoke_runs["rl"])
    assert m.push_to_hub("someone/tiny-rl", private=True) == "commit"
    assert seen["create"] == ("someone/tiny-rl", {"private": True, "exist_ok": True, "repo_type": "model"})
    assert seen["upload"][0] == "someone/tiny-rl"
    assert _same_weights(m, rltok.from_pretrained(tmp_path / "uploaded"))


def test_save_into_the_run_itself_is_refused(smoke_runs):
    with pytest.raises(RltokError, match="own run directory"):
        rltok.load(smoke_runs["rl"]).save_pretrained(smoke_runs["rl"])
