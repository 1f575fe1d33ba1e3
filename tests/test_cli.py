"""The command line: clear one-line errors, help for every command, the main path."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rltok.cli import build_parser, main


def _run(capsys, argv):
    code = main(argv)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def _one_line_error(err):
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert lines and lines[-1].startswith("error: "), err
    assert "Traceback" not in err
    return lines[-1]


def test_missing_data_path(capsys, tmp_path):
    code, _, err = _run(capsys, ["train", "--preset", "smoke", "--data", str(tmp_path / "nope.jsonl"),
                                 "--out", str(tmp_path / "r"), "--no-progress"])
    assert code == 2 and "nope.jsonl" in _one_line_error(err)
    assert not (tmp_path / "r" / "config.json").exists()


def test_empty_corpus(capsys, tmp_path):
    (tmp_path / "e.jsonl").write_text("\n\n")
    code, _, err = _run(capsys, ["train", "--preset", "smoke", "--data", str(tmp_path / "e.jsonl"),
                                 "--out", str(tmp_path / "r"), "--no-progress"])
    assert code == 2 and "no documents" in _one_line_error(err)


def test_malformed_jsonl_line(capsys, tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"text": broken\n')
    code, _, err = _run(capsys, ["train", "--preset", "smoke", "--data", str(tmp_path / "bad.jsonl"),
                                 "--out", str(tmp_path / "r"), "--no-progress"])
    assert code == 2 and "bad.jsonl:2:" in _one_line_error(err)


@pytest.mark.parametrize("override,needle", [
    ("boundary.target_rate=1.5", "target_rate"), ("target_rate=0", "target_rate"),
    ("model.window=0", "window"), ("boundary.gamma=1.2", "gamma"), ("train.lr=-1", "lr"),
    ("nonsense=3", "unknown config key"), ("model.d_model=abc", "d_model"),
])
def test_out_of_range_config(capsys, tmp_path, override, needle):
    code, _, err = _run(capsys, ["train", "--preset", "smoke", "--set", override, "--out", str(tmp_path / "r")])
    assert code == 2 and needle in _one_line_error(err)
    assert not (tmp_path / "r").exists()  # rejected before any work


def test_not_a_run(capsys, tmp_path):
    code, _, err = _run(capsys, ["eval", str(tmp_path)])
    assert code == 2 and "not an rltok run" in _one_line_error(err)
    code, _, err = _run(capsys, ["eval", str(tmp_path / "missing")])
    assert code == 2 and "no such run" in _one_line_error(err)


def test_every_subcommand_has_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    assert {"train", "eval"} <= set(sub.choices)
    for name, p in sub.choices.items():
        text = p.format_help()
        for action in p._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{name} {action.option_strings} has no help"
        assert text


def test_train_then_eval_json(capsys, small_corpus_file, tmp_path):
    code, out, err = _run(capsys, ["train", "--preset", "smoke", "--data", str(small_corpus_file),
                                   "--out", str(tmp_path / "r"), "--no-progress", "--set", "train.eval_docs=2"])
    assert code == 0, err
    code, out, err = _run(capsys, ["eval", str(tmp_path / "r"), "--docs", "3", "--json", "--per-doc"])
    assert code == 0, err
    d = json.loads(out.strip().splitlines()[-1])
    for k in ("bpb", "bpb_se", "rate", "whitespace_recall", "whitespace_precision", "docs", "bytes", "per_doc_bpb"):
        assert k in d
    assert d["docs"] == 3 and len(d["per_doc_bpb"]) == 3 and 0 < d["rate"] < 1
    assert abs(sum(d["per_doc_bpb"]) / 3 - d["bpb"]) < 1e-9
    # a run against itself: same documents, same draws, so every paired difference is 0
    code, out, err = _run(capsys, ["eval", str(tmp_path / "r"), "--docs", "3", "--json",
                                   "--against", str(tmp_path / "r")])
    assert code == 0, err
    p = json.loads(out.strip().splitlines()[-1])["against"]["paired"]
    assert p["diff"] == 0 and p["n"] == 3


def test_paired_difference_by_hand():
    from rltok.evaluate import paired_difference

    p = paired_difference([2.0, 3.0, 5.0], [1.0, 3.0, 4.0])  # differences 1, 0, 1
    assert p["diff"] == pytest.approx(2 / 3) and p["n"] == 3
    assert p["se"] == pytest.approx((1 / 3) ** 0.5 / 3 ** 0.5)  # sd of (1,0,1) = sqrt(1/3)


def test_subprocess_error_has_no_traceback(tmp_path):
    r = subprocess.run([sys.executable, "-m", "rltok", "train", "--preset", "smoke", "--data",
                        str(tmp_path / "none.txt"), "--out", str(tmp_path / "r")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and r.stderr.strip().startswith("error:")
    assert len(r.stderr.strip().splitlines()) == 1


def test_help_and_argument_errors_do_not_import_torch():
    """`rltok --help`, a command's --help and argparse errors answer without importing torch
    (3-10 s on a busy machine): every subcommand imports its heavy modules when it runs."""
    code = ("import sys, contextlib, io\n"
            "from rltok.cli import main\n"
            "for argv in (['--help'], ['train', '--help'], ['eval', '--help'], ['tasks', '--help'],\n"
            "             ['generate', '--help'], ['data', '--help'], ['train', '--bogus']):\n"
            "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            "        try:\n"
            "            main(argv)\n"
            "        except SystemExit:\n"
            "            pass\n"
            "print(sorted(m for m in ('torch', 'numpy', 'huggingface_hub', 'tokenizers') if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_default_corpus_falls_back_to_stdlib_in_one_line(monkeypatch, capsys):
    """The tiny preset trains on the built-in English corpus; where its registries cannot be
    reached, `rltok train` says so in one line and uses the built-in code corpus."""
    from rltok.cli import train_cmd
    from rltok.config import build_config
    from rltok.data import builtin
    from rltok.errors import RltokError

    cfg = build_config("rl", "tiny")
    assert cfg.data.source == "english"

    def unreachable():
        raise RltokError("built-in corpus 'english': apt-get download failed (no network)")

    monkeypatch.setattr(builtin, "ensure_english", unreachable)
    train_cmd._english_or_stdlib(cfg)
    err = capsys.readouterr().err
    assert cfg.data.source == "stdlib" and len(err.strip().splitlines()) == 1
    assert "no network" in err and "'stdlib'" in err


def test_install_keeps_an_installed_torch():
    """The notebook install line (README: `pip install -e .` without the pin) must not replace
    the torch a notebook already has: pip, offline, would install rltok alone."""
    pytest.importorskip("setuptools")
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation",
                        "--disable-pip-version-check", "-e", str(root)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-1500:] + r.stderr[-1500:]
    would = [line for line in r.stdout.splitlines() if line.startswith("Would install")]
    assert would and would[0].split()[2:] == [f"rltok-{__import__('rltok').__version__}"], would


def test_off_target_remark():
    from rltok.schema import off_target

    assert off_target("rl", 0.244, 0.2) and off_target("hnet", 0.17, 0.2)
    assert not off_target("rl", 0.219, 0.2) and not off_target("rl", float("nan"), 0.2)
    assert not off_target("whitespace", 0.4, 0.2)  # its rate is the rule's, not steered


def test_eval_says_when_the_rate_is_off_target(smoke_runs, capsys):
    """Greedy boundaries of the barely trained smoke policy sit far below its 0.2 target (0.03):
    the text output says so, with the difference; sampled ones (0.199) do not draw the remark."""
    for extra, remark in ((["--greedy"], True), ([], False)):
        assert main(["eval", str(smoke_runs["rl"]), "--docs", "4", "--json", *extra]) == 0
        d = json.loads(capsys.readouterr().out)
        assert main(["eval", str(smoke_runs["rl"]), "--docs", "4", *extra]) == 0
        out = capsys.readouterr().out
        assert (f"target 0.2: off by {d['rate'] - d['target_rate']:+.3f}" in out) == remark, (d["rate"], out)
