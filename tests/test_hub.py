"""save_pretrained / from_pretrained / push_to_hub with huggingface_hub's conventions, offline:
local directories, a Hub cache read with local_files_only, and the upload seen at HfApi.

By default a saved model is a transformers export (rltok.hf) that rltok opens as a run; the flat
baselines, and ``transformers=False``, get the run layout. (That transformers loads the export:
tests/test_hf.py.)"""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import rltok
from rltok.cli import main
from rltok.errors import RltokError
from rltok.hub import save_pretrained

pytest.importorskip("huggingface_hub")

LAYOUTS = {"export": None, "run-layout": False}  # save_pretrained(transformers=...)


def _same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _is_export(out) -> bool:
    d = json.loads((out / "config.json").read_text())
    return d.get("model_type") == "rltok" and "AutoModelForCausalLM" in d.get("auto_map", {})


def test_round_trip_and_model_card(smoke_runs, tmp_path):
    m = rltok.load(smoke_runs["rl"])
    out = m.save_pretrained(tmp_path / "export")
    assert {p.name for p in out.iterdir()} >= {"config.json", "model.safetensors", "README.md", "summary.json",
                                               "modeling_rltok.py", "tokenizer_config.json"}
    assert _is_export(out)  # the default: transformers loads it (tests/test_hf.py)
    m2 = type(m).from_pretrained(out)
    assert type(m2) is type(m) and _same_weights(m, m2)
    assert m2.run_config.to_dict() == m.run_config.to_dict()
    assert m2.weights["finished"] is True
    card = (out / "README.md").read_text()
    summary = json.loads((smoke_runs["rl"] / "summary.json").read_text())
    assert card.startswith("---\n") and "library_name: transformers" in card and "method-rl" in card
    assert "trust_remote_code=True" in card and "rltok.from_pretrained" in card
    assert f"{summary['val_bpb']:.4f}" in card and "final weights of a finished run" in card
    from huggingface_hub import ModelCard

    assert ModelCard.load(out / "README.md").data.library_name == "transformers"  # the card parses


def test_run_layout_on_request(smoke_runs, tmp_path):
    m = rltok.load(smoke_runs["rl"])
    out = save_pretrained(m, tmp_path / "plain", transformers=False)
    assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors", "README.md", "summary.json"}
    assert json.loads((out / "config.json").read_text())["method"] == "rl"  # a run's config.json
    m2 = rltok.from_pretrained(out)
    assert _same_weights(m, m2) and m2.run_config.to_dict() == m.run_config.to_dict()
    assert "library_name: rltok" in (out / "README.md").read_text()
    # the model's own method takes the same choice (it used to swallow it into push_to_hub's kwargs)
    out2 = m.save_pretrained(tmp_path / "plain2", transformers=False)
    assert json.loads((out2 / "config.json").read_text())["method"] == "rl"
    out3 = m.save_pretrained(tmp_path / "hf")
    assert "auto_map" in json.loads((out3 / "config.json").read_text())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_saved_model_is_a_run_for_every_command(layout, smoke_runs, tmp_path, capsys, one_thread):
    m = rltok.load(smoke_runs["rl"])
    out = save_pretrained(m, tmp_path / "export", transformers=LAYOUTS[layout])
    data = m.run_config.data.source
    assert main(["eval", str(out), "--data", data, "--docs", "2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["checkpoint"] == "model.safetensors" and d["finished"] is True
    assert _same_weights(m, rltok.load(out))
    from rltok.run import read_config

    assert read_config(out).to_dict() == m.run_config.to_dict()


def test_an_export_has_no_checkpoints(smoke_runs, tmp_path):
    out = rltok.load(smoke_runs["rl"]).save_pretrained(tmp_path / "export")
    with pytest.raises(RltokError, match="no checkpoints"):
        rltok.load(out, checkpoint="step_00000002")


def test_flat_baselines_fall_back_to_the_run_layout(tmp_path):
    from rltok.config import build_config
    from rltok.run import build_model

    cfg = build_config("bytes", "smoke")
    m = build_model(cfg)
    m.run_config = cfg
    out = m.save_pretrained(tmp_path / "bytes")  # the default: no transformers export for it
    assert not _is_export(out) and not list(out.glob("*.py"))
    assert _same_weights(m, type(m).from_pretrained(out))
    with pytest.raises(RltokError, match="flat baseline"):
        save_pretrained(m, tmp_path / "refused", transformers=True)
    assert not (tmp_path / "refused").exists()


def test_saving_needs_no_transformers(smoke_runs, tmp_path):
    """The default save (the export) and every load, in a process where transformers cannot be
    imported."""
    code = ("import sys; sys.modules['transformers'] = None\n"  # import transformers now fails
            "import torch, rltok\n"
            "m = rltok.load(sys.argv[1]); out = m.save_pretrained(sys.argv[2]); m2 = rltok.load(out)\n"
            "a, b = m.state_dict(), m2.state_dict()\n"
            "assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)\n"
            "assert not any(k == 'transformers' or k.startswith('transformers.') for k in sys.modules if sys.modules[k])\n")
    r = subprocess.run([sys.executable, "-c", code, str(smoke_runs["rl"]), str(tmp_path / "export")],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert _is_export(tmp_path / "export")


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
    m = rltok.load(tmp_path / "bpe")
    plain = save_pretrained(m, tmp_path / "plain", transformers=False)
    assert (plain / "tokenizer.json").is_file()
    out = m.save_pretrained(tmp_path / "export")  # the export carries it in config.json
    assert "tokenizer.json" in json.loads((out / "config.json").read_text())["method_files"]
    assert not (out / "tokenizer.json").exists()
    shutil.rmtree(tmp_path / "bpe")  # both stand alone
    for d in (plain, out):
        m2 = rltok.from_pretrained(d)
        assert m2.run_config.method == "bpe" and _same_weights(m, m2)
    # saved again from what was loaded, in the other layout: the method's files go along
    again = save_pretrained(rltok.load(out), tmp_path / "again", transformers=False)
    assert (again / "tokenizer.json").read_bytes() == (plain / "tokenizer.json").read_bytes()
    assert not list(again.glob("*.py")) and not (again / "tokenizer_config.json").exists()
    again2 = rltok.load(plain).save_pretrained(tmp_path / "again2")
    assert json.loads((again2 / "config.json").read_text())["method_files"] == \
        json.loads((out / "config.json").read_text())["method_files"]


def test_saving_over_the_other_layout_leaves_none_of_it(tmp_path, smoke_runs):
    m = rltok.load(smoke_runs["rl"])
    out = m.save_pretrained(tmp_path / "x")
    save_pretrained(m, out, transformers=False)
    assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors", "README.md", "summary.json"}
    (out / "tokenizer.json").write_text("{}")  # as a BPE method's run layout has it
    m.save_pretrained(out)
    assert _is_export(out) and not (out / "tokenizer.json").exists()
    assert _same_weights(m, rltok.load(out))
    foreign = tmp_path / "foreign"  # some other model's folder: nothing of it is removed
    foreign.mkdir()
    (foreign / "config.json").write_text('{"model_type": "llama"}')
    (foreign / "tokenizer.json").write_text("{}")
    m.save_pretrained(foreign)
    assert (foreign / "tokenizer.json").is_file() and _is_export(foreign)


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
    assert _is_export(tmp_path / "uploaded") and "someone/tiny-rl" in (tmp_path / "uploaded" / "README.md").read_text()
    assert _same_weights(m, rltok.from_pretrained(tmp_path / "uploaded"))


def test_save_into_the_run_itself_is_refused(smoke_runs):
    with pytest.raises(RltokError, match="own run directory"):
        rltok.load(smoke_runs["rl"]).save_pretrained(smoke_runs["rl"])
