"""Hand-edited, truncated, foreign-version and wrong-shape run directories: every command and
API that opens a run refuses them with one line naming the file and what is wrong, exit status
2, no traceback."""

import json
import shutil
import subprocess
import sys

import pytest
import torch

from rltok.errors import RltokError


def _edit(run, fn):
    p = run / "config.json"
    d = json.loads(p.read_text())
    fn(d)
    p.write_text(json.dumps(d))


def _double_width(d):
    d["model"]["d_model"] *= 2


def _unknown_key(d):
    d["model"]["attn_impl"] = "flash"


def _unknown_top(d):
    d["version"] = 3


def _missing_key(d):
    del d["model"]["n_heads"]


def _future_format(d):
    d["format_version"] = 99
    d["rltok_version"] = "9.0.0"


CASES = {  # name: (how to damage the run, what the one line must say)
    "wrong_shape": (_double_width, "has shape"),
    "unknown_key": (_unknown_key, "unknown key model.attn_impl"),
    "unknown_top_key": (_unknown_top, "unknown key version"),
    "missing_key": (_missing_key, "missing key model.n_heads"),
    "foreign_version": (_future_format, "reads formats up to"),
    "truncated_config": (lambda d: None, "unreadable run config"),
    "truncated_weights": (lambda d: None, "not a valid safetensors file"),
}


@pytest.fixture(params=sorted(CASES))
def damaged(request, smoke_runs, tmp_path):
    name = request.param
    run = tmp_path / name
    shutil.copytree(smoke_runs["rl"], run)
    fn, msg = CASES[name]
    if name == "truncated_config":
        p = run / "config.json"
        p.write_text(p.read_text()[:100])
    elif name == "truncated_weights":
        p = run / "model.safetensors"
        p.write_bytes(p.read_bytes()[:1000])
    else:
        _edit(run, fn)
    return run, msg


def test_a_run_records_who_wrote_it(smoke_runs):
    import rltok
    from rltok.schema import FORMAT_VERSION

    d = json.loads((smoke_runs["rl"] / "config.json").read_text())
    assert d["rltok_version"] == rltok.__version__ and d["format_version"] == FORMAT_VERSION


COMMANDS = {
    "eval": lambda run: ["eval", str(run), "--docs", "1"],
    "boundaries": lambda run: ["boundaries", str(run), "--text", "Hello there."],
    "generate": lambda run: ["generate", str(run), "--prompt", "Hello", "--max-bytes", "4"],
    "tasks": lambda run: ["tasks", str(run), "--limit", "1"],
    "analyze": lambda run: ["analyze", str(run)],
    "bench": lambda run: ["bench", "--preset", "smoke", "--method", "rl", "--steps", "1", "--init-from", str(run)],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_commands_refuse_a_damaged_run_in_one_line(damaged, command):
    run, msg = damaged
    proc = subprocess.run([sys.executable, "-m", "rltok", *COMMANDS[command](run)], capture_output=True,
                          text=True, timeout=300)
    err = proc.stderr.strip()
    assert proc.returncode == 2, (command, proc.returncode, err[-2000:])
    assert "Traceback" not in err, err
    last = err.splitlines()[-1]
    assert msg in last and str(run) in last, last


def test_python_api_and_lm_eval_adapter_refuse_a_damaged_run(damaged):
    run, msg = damaged
    import rltok

    with pytest.raises(RltokError, match=msg):
        rltok.load(run)
    pytest.importorskip("lm_eval")
    from rltok.tasks.lm_eval_adapter import RltokLM

    with pytest.raises(RltokError, match=msg):
        RltokLM(path=str(run))


def test_resume_names_the_tensor(smoke_runs, tmp_path):
    run = tmp_path / "r"
    shutil.copytree(smoke_runs["rl"], run)
    _edit(run, _double_width)
    proc = subprocess.run([sys.executable, "-m", "rltok", "train", "--out", str(run), "--resume", "--steps", "9"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "has shape" in proc.stderr.strip().splitlines()[-1]


def test_runs_from_before_versions_still_open(smoke_runs, tmp_path):
    """A run written before versions were recorded (format 0) opens; its keys are read leniently."""
    import rltok

    run = tmp_path / "old"
    shutil.copytree(smoke_runs["rl"], run)

    def old(d):
        d.pop("rltok_version")
        d.pop("format_version")
        d["boundary"].pop("init_scale")  # a key added later

    _edit(run, old)
    assert rltok.load(run).run_config.boundary.init_scale == 1.0


@pytest.mark.parametrize("fmt", [1, 2, 3])
def test_older_formats_open_without_the_keys_added_since(smoke_runs, tmp_path, fmt):
    """A key added in a later format takes its default in an older run; a key its own format
    already had is still named when missing."""
    import rltok
    from rltok.schema import ADDED_KEYS, FORMAT_VERSION

    assert FORMAT_VERSION > fmt
    run = tmp_path / f"v{fmt}"
    shutil.copytree(smoke_runs["rl"], run)
    later = [k for k, v in ADDED_KEYS.items() if v > fmt]
    assert later

    def older(d):
        d["format_version"] = fmt
        for key in later:
            sec, name = key.split(".")
            d.get(sec, {}).pop(name, None)  # a key of another method's config is not in this run

    _edit(run, older)
    cfg = rltok.load(run).run_config
    assert cfg.boundary.rate_schedule == "" and cfg.model.shared_head is False
    _edit(run, lambda d: d.update(format_version=FORMAT_VERSION))
    with pytest.raises(RltokError, match="missing key"):
        rltok.load(run)


def test_a_format_10_run_with_flat_weight_names_loads(smoke_runs, tmp_path):
    """A run trained before stages were recursive (format 10: flat parameter names such as
    ``boundary.proj.bias``) loads: its names are renamed before they are checked against the
    model (the check once refused them, so a study could not evaluate an older run)."""
    from pathlib import Path

    from safetensors.torch import load_file, save_file

    import rltok

    old_names = json.loads((Path(__file__).parent / "data" / "format10_keys.json").read_text())["rl"]
    run = tmp_path / "v10"
    shutil.copytree(smoke_runs["rl"], run)
    want = rltok.load(run).state_dict()
    assert len(want) == len(old_names)
    save_file({old: t.contiguous() for old, t in zip(old_names, want.values())}, str(run / "model.safetensors"))
    assert "boundary.proj.bias" in load_file(str(run / "model.safetensors"))
    _edit(run, lambda d: d.update(format_version=10))
    got = rltok.load(run).state_dict()
    assert list(got) == list(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k


@pytest.mark.parametrize("fmt", [4, 9, 12])
def test_an_older_bpe_lm_run_opens_without_flat_match(tmp_path, fmt):
    """bpe-lm gained flat.match in format 13: an older bpe-lm run's config lacks it and opens with
    the default (what it did: total FLOPs matched). A key listed twice in ADDED_KEYS once hid this."""
    from rltok.config import build_config
    from rltok.run import read_config, write_config

    run = tmp_path / "bpe-lm"
    run.mkdir()
    write_config(run, build_config("bpe-lm", "smoke"))

    def older(d):
        d["format_version"] = fmt
        del d["flat"]["match"]

    _edit(run, older)
    assert read_config(run).flat.match == "flops"
