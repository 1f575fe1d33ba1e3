"""The replication study's bookkeeping (tools/study.py): the cell plan, and the seed-level summary
that decides its claims (paired against uniform of the same seed; matching flags)."""

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def study():
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import study as s
    finally:
        sys.path.pop(0)
    return s


def _cell(tag, method, seed, bpb, rate=0.2, late=0.2, flops=9.5e6):
    ev = {"bpb": bpb, "rate": rate, "whitespace_recall": 0.8, "word_start_recall": 0.7,
          "per_doc_bpb": [bpb - 0.1, bpb + 0.1]}
    return {"rung": "2M", "tag": tag, "method": method, "seed": seed, "bytes": 2_000_000, "rate": rate,
            "train_rate": late, "train_rate_late": late, "flops_per_byte": flops, "params": 1, "epochs": 0.04,
            "test": dict(ev), "c4": dict(ev), "wikitext": dict(ev)}


def test_plan_runs_whole_seeds_and_the_top_rung_subset(study):
    cells = study.plan(["2M", "32M"], ablations=True)
    two = [c for c in cells if c[0] == "2M"]
    assert len(two) == 3 * len(study.VARIANTS)  # no ablations at 2 MB
    assert [c[2] for c in two[: len(study.VARIANTS)]] == [1] * len(study.VARIANTS)  # seed 1 first
    top = {c[1] for c in cells if c[0] == "32M"}
    assert {"rl", "uniform", "nawrot", "hnet", "bpe", "bpe-lm"} <= top and "abl-gamma1" not in top
    eight = [c for c in study.plan(["8M"], ablations=True) if c[1] == "abl-gamma1"]
    assert [c[2] for c in eight] == [1, 2, 3]  # the ablations at 8 MB, three seeds


def test_summary_pairs_seeds_against_uniform_and_flags_matching(study):
    cells = [_cell("uniform", "uniform", s, 2.0 + 0.1 * s) for s in (1, 2, 3)]
    cells += [_cell("rl", "rl", s, 1.9 + 0.1 * s + 0.01 * (s - 2)) for s in (1, 2, 3)]
    cells += [_cell("hnet", "hnet", s, 2.0, rate=0.2, late=0.3, flops=9.6e6) for s in (1, 2, 3)]
    cells += [_cell("bytes-params", "bytes", s, 1.8, flops=20e6) for s in (1, 2, 3)]
    s = study.summarize(cells)["2M"]
    d = s["rl"]["test_delta_vs_uniform"]
    # per seed: -0.11, -0.10, -0.09 -> mean -0.10, SE over seeds 0.01/sqrt(3)
    assert d["mean"] == pytest.approx(-0.10) and d["se_seeds"] == pytest.approx(0.01 / 3 ** 0.5)
    assert s["rl"]["test_bpb"]["se_seeds"] == pytest.approx(0.11 / 3 ** 0.5)
    assert d["mean_docs"] == pytest.approx(-0.10) and d["docs"] == 2  # per document, over the seeds
    assert s["rl"]["rate_matched"] and not s["hnet"]["rate_matched"]  # off r* late in training
    assert s["hnet"]["flop_matched"] and not s["bytes-params"]["flop_matched"]
    assert "rate_matched" not in s["bytes-params"]  # a flat model has no boundary rate to match
    table = study.tables(study.summarize(cells))
    assert "| hnet | 3 |" in table and " *" in table and " †" in table


def _stats(rate, hist):
    keys = ("whitespace_precision", "whitespace_recall", "bpe_precision", "bpe_recall", "bpe_f1",
            "mean_chunk_bytes", "entropy_bits")
    return {"rate": rate, "chunk_hist": hist, **{k: 0.5 for k in keys}}


def test_boundary_statistics_pool_seeds_and_bpe_lm_gap_closes_per_doubling(study, tmp_path):
    cells = []
    for rung, bpe_gap in (("2M", -0.6), ("8M", -0.4)):  # bpe-lm's lead over rl, per rung
        for s in (1, 2, 3):
            rl = _cell("rl", "rl", s, 3.0 + 0.01 * s)
            rl["boundary_stats"] = _stats(0.2, [3, 1] if s == 1 else [1, 3])
            lm = _cell("bpe-lm", "bpe-lm", s, rl["test"]["bpb"] + bpe_gap)
            lm["boundary_stats"] = _stats(0.3, [2, 2])
            for c in (rl, lm):
                c["rung"] = rung
                c["bytes"] = study.RUNGS[rung]
            cells += [rl, lm]
    cells += [_cell("bytes", "bytes", s, 3.5) for s in (1, 2, 3)]  # flat: no boundaries
    summary = study.summarize(cells)
    # chunk lengths pooled over the seeds' counts: (3+1+1, 1+3+3) / 12
    assert summary["2M"]["rl"]["chunk_hist"] == pytest.approx([5 / 12, 7 / 12])
    assert summary["2M"]["rl"]["boundary"]["rate"] == pytest.approx(0.2)
    assert summary["2M"]["rl"]["rate"] == pytest.approx(0.2)  # the evaluation rate is not overwritten
    table = study.boundary_table(summary)
    assert "| rl | 3 |" in table and "| bytes |" not in table
    gap = study.bpe_lm_gap(summary)
    # 2M -> 8M is two doublings: (-0.4 - -0.6) / 2 = +0.1 per doubling; level after 4 more (128 MB)
    assert "-0.600 ± 0.000" in gap and "+0.100 bits/byte per doubling" in gap
    assert "4.0 more doublings" in gap and "128 MB" in gap
    # the best chunking U-Net is rl (bpe-lm is not one)
    assert "| 8M | 3 | -0.400 ± 0.000 |" in gap and "| rl | -0.400 |" in gap
    study.chunk_plot(summary, tmp_path / "chunks.png")
    assert (tmp_path / "chunks.png").stat().st_size > 0


def test_calibrate_measures_knobbed_cells_at_rate_and_asks_knobless_ones_again(study, tmp_path, small_corpus_file,
                                                                                monkeypatch, one_thread):
    """study.py calibrate: a finished cell whose router has a rate knob gets its measurements at r*
    (here the paper's penalty-only rl, flagged no_rate_knob by a checkout from before every rl
    policy had its offset); a rule is flagged no_rate_knob; a second pass changes nothing."""
    import argparse
    import json

    from rltok.config import build_config
    from rltok.train import train

    monkeypatch.setattr(study, "OUT", tmp_path / "out")
    monkeypatch.setattr(study, "RUNS", tmp_path / "runs")
    # the real calibration on the run's validation split; the out-of-domain sets stubbed
    monkeypatch.setattr(study, "measure_sets", lambda model, splits: {"test": {"rate": 0.2, "bpb": 1.0}})
    cells = {}
    for tag, method in (("rl-penalty", "rl"), ("uniform", "uniform")):
        cfg = build_config(method, "smoke", overrides={"data.source": str(small_corpus_file), "train.max_steps": 2,
                                                       "train.eval_docs": 2})
        train(cfg, tmp_path / "runs" / "2M" / f"{tag}_s1", progress=False)
        rec = {"rung": "2M", "tag": tag, "seed": 1, "rate": 0.2, "bpb": 1.0}
        if method == "rl":
            rec["no_rate_knob"] = True
        cells[tag] = tmp_path / "out" / "cells" / "2M" / f"{tag}_s1.json"
        cells[tag].parent.mkdir(parents=True, exist_ok=True)
        cells[tag].write_text(json.dumps(rec))
    args = argparse.Namespace(rungs="", tags="")
    assert study.cmd_calibrate(args) == 0
    rl, uni = (json.loads(cells[t].read_text()) for t in ("rl-penalty", "uniform"))
    assert "no_rate_knob" not in rl and rl["calibrated"]["evaluations"] >= 1 and "test" in rl["calibrated"]
    assert uni["no_rate_knob"] is True and "calibrated" not in uni
    before = {t: p.read_bytes() for t, p in cells.items()}
    assert study.cmd_calibrate(args) == 0
    assert {t: p.read_bytes() for t, p in cells.items()} == before


def test_basin_fit_centres_each_seed_and_leaves_out_the_unpenalised_row(study):
    """Within each seed bpb falls 0.5 per unit of whitespace recall (seed 2's bpb a whole bit
    higher); the row without the rate penalty runs at another rate and is not in the fit."""
    cells = []
    for seed, rows in ((1, ((0.8, 2.0), (0.6, 2.1), (0.4, 2.2))), (2, ((0.9, 3.0), (0.5, 3.2), (0.1, 3.4)))):
        for tag, (ws, bpb) in zip(("rl", "rl-penalty", "abl-gamma1"), rows):
            c = _cell(tag, "rl", seed, bpb)
            c["test"]["whitespace_recall"] = ws
            cells.append(c)
    wild = _cell("abl-no-rate-penalty", "rl", 1, 9.0)
    wild["test"]["whitespace_recall"] = 0.9
    text = study.basin_fit(cells + [wild])
    assert "- 2M: r = -1.00 over 6 cells (3 rows, 2 seeds); -0.500 bits/byte per unit" in text
    assert study.basin_fit(cells[:3]) == ""  # fewer than 4 cells: no fit


def test_ablation_table_pairs_each_ablation_with_its_baseline_by_seed(study):
    """The ablations are read against rl-penalty, seed by seed; a seed the baseline lacks is left
    out and the row says over how many seeds its difference is."""
    cells = [_cell("rl", "rl", s, 2.0) for s in (1, 2, 3)]
    cells += [_cell("rl-penalty", "rl", s, 2.0 + 0.1 * (s - 1)) for s in (1, 2, 3)]
    cells += [_cell("abl-gamma1", "rl", s, b) for s, b in ((1, 2.05), (2, 2.17))]
    cells += [_cell("abl-w8", "rl", s, b) for s, b in ((1, 2.01), (2, 2.13), (4, 9.0))]
    s = study.summarize(cells)["2M"]
    d = s["abl-gamma1"]["test_delta_vs_rl-penalty"]
    # per seed +0.05, +0.07: mean +0.06, SE over seeds 0.01
    assert d["mean"] == pytest.approx(0.06) and d["se_seeds"] == pytest.approx(0.01) and d["seeds"] == 2
    assert "test_delta_vs_rl-penalty" not in s["rl"]  # the ablations' baseline is theirs only
    assert "test_delta_vs_rl" in s["rl-penalty"] and "test_delta_vs_uniform" not in s["rl"]  # (no uniform here)
    table = study.ablation_table(study.summarize(cells))
    assert "| abl-gamma1 | 2 | 2.1100 ± 0.0600 | 0.060 ± 0.010 |" in table
    assert "| abl-w8 | 3 | " in table and "| 0.020 ± 0.010 (2) |" in table
    assert table.index("| rl-penalty |") < table.index("| abl-gamma1 |")
    assert study.ablation_table(study.summarize(cells[:3])) == ""  # no ablations, no table


def _cell_args(rung="8M", tag="rl", seed=1):
    import argparse

    return argparse.Namespace(rung=rung, tag=tag, seed=seed)


def test_a_cell_held_by_another_process_is_skipped_not_run_twice(study, tmp_path, monkeypatch, capsys):
    import subprocess

    monkeypatch.setattr(study, "OUT", tmp_path / "results")
    monkeypatch.setattr(study, "RUNS", tmp_path / "runs")
    lock = tmp_path / "runs" / "8M" / "rl_s1.lock"
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", f"""
import fcntl, sys, time
f = open({str(lock)!r}, "w"); fcntl.flock(f, fcntl.LOCK_EX); print("held", flush=True); time.sleep(60)"""],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"

        def never(*a):
            raise AssertionError("a second process trained a cell that is running")

        monkeypatch.setattr(study, "shared_bpe", never)
        monkeypatch.setattr(study, "train_cell", never)
        assert study.cmd_cell(_cell_args()) == 0
        assert "running in another process, skipped" in capsys.readouterr().out
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone (a killed run leaves no stale lock): the cell runs now
    ran = []
    monkeypatch.setattr(study, "shared_bpe", lambda: tmp_path / "bpe.json")
    monkeypatch.setattr(study, "train_cell", lambda *a: ran.append(a) or tmp_path / "run")
    monkeypatch.setattr(study, "measure_cell", lambda *a: {"bpb": 2.0, "rate": 0.2})
    monkeypatch.setattr(study, "keep_run_files", lambda *a: None)
    assert study.cmd_cell(_cell_args()) == 0
    assert ran and study.cell_path("8M", "rl", 1).is_file()


def test_a_cell_on_a_fresh_machine_gets_the_shared_bpe_fitted_not_a_stale_path(study, tmp_path, monkeypatch):
    # bpe.json (committed) names a cache path from another machine; the cell must ask shared_bpe,
    # which fits the tokenizer where the cache lacks it, and measure against what it returns
    monkeypatch.setattr(study, "OUT", tmp_path / "results")
    monkeypatch.setattr(study, "RUNS", tmp_path / "runs")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "bpe.json").write_text('{"path": "/nowhere/bpe.json", "val_tokens_per_byte": 0.27}')
    fitted = tmp_path / "cache" / "bpe.json"
    seen = {}
    monkeypatch.setattr(study, "shared_bpe", lambda: fitted)
    monkeypatch.setattr(study, "train_cell", lambda r, t, s, tok: seen.setdefault("train", tok) and tmp_path)
    monkeypatch.setattr(study, "measure_cell", lambda r, t, s, run, tok: seen.setdefault("measure", tok) and
                        {"bpb": 2.0, "rate": 0.2})
    monkeypatch.setattr(study, "keep_run_files", lambda *a: None)
    assert study.cmd_cell(_cell_args("2M", "bpe", 2)) == 0
    assert seen == {"train": fitted, "measure": fitted}


def test_plan_estimates_a_todo_cell_from_its_own_seeds_then_its_tag_scaled_by_bytes(study):
    seconds = {("2M", "rl"): [100.0, 300.0, 200.0], ("8M", "rl"): [900.0], ("2M", "uniform"): [50.0],
               ("8M", "nawrot"): [1000.0, 1200.0]}
    assert study.expected_seconds("8M", "rl", seconds) == 900.0  # its own finished seed
    assert study.expected_seconds("32M", "rl", seconds) == 3600.0  # 8M's, four times the bytes
    assert study.expected_seconds("8M", "uniform", seconds) == 200.0  # 2M's 50 s, scaled by 4
    assert study.expected_seconds("8M", "hnet", seconds) == 1000.0  # no hnet anywhere: median of 900, 1000, 1200
    assert study.expected_seconds("2M", "hnet", seconds) == 150.0  # median of 50, 100, 200, 300
    assert study.expected_seconds("2M", "rl", {}) is None


def test_run_under_a_time_limit_takes_the_first_cell_that_fits(study):
    seconds = {("8M", "rl"): [600.0], ("32M", "rl"): [3000.0]}
    todo = [("32M", "rl", 2), ("8M", "rl", 3), ("32M", "hnet", 1), ("8M", "rl", 2)]
    # 2000 s left: the 32 MB cell (3000 s) would not finish, the first 8 MB one (600 s) does
    left = list(todo)
    assert study.next_cell(left, seconds, end=2000.0, now=0.0) == ("8M", "rl", 3)
    assert left == [("32M", "rl", 2), ("32M", "hnet", 1), ("8M", "rl", 2)]
    assert study.next_cell(left, seconds, end=4000.0, now=0.0) == ("32M", "rl", 2)  # now it fits
    assert study.next_cell(left, seconds, end=600.0, now=0.0) is None  # nothing fits: todo unchanged
    assert len(left) == 2
    assert study.next_cell(left, seconds, end=None, now=0.0) == ("32M", "hnet", 1)  # no limit: in order


def test_run_partial_starts_a_cell_that_cannot_finish(study):
    # a 3000 s cell in 2000 s: not started, unless --partial; then the first todo cell, while at
    # least PARTIAL_MIN_SECONDS are left
    seconds = {("32M", "rl"): [3000.0]}
    todo = [("32M", "rl", 2), ("32M", "rl", 3)]
    assert study.next_cell(list(todo), seconds, end=2000.0, now=0.0) is None
    left = list(todo)
    assert study.next_cell(left, seconds, end=2000.0, now=0.0, partial=True) == ("32M", "rl", 2)
    assert left == [("32M", "rl", 3)]
    short = study.PARTIAL_MIN_SECONDS - 1
    assert study.next_cell(list(todo), seconds, end=short, now=0.0, partial=True) is None
    assert study.next_cell([], seconds, end=2000.0, now=0.0, partial=True) is None


def test_a_slower_machine_starts_fewer_cells(study):
    # estimates come from other machines' cells; this run's finished cells say this one takes 2x
    assert study.machine_pace([]) == 1.0 and study.machine_pace([], prior=2.0) == 2.0
    assert study.machine_pace([2.1, 1.9, 5.0]) == 2.1
    assert study.machine_pace([2.0, 3.0]) == 2.5
    seconds = {("8M", "rl"): [600.0]}
    todo = [("8M", "rl", 2)]
    # 600 s + the measurement's 120 s fit in 1000 s at the estimates' pace, not at twice it
    assert study.next_cell(list(todo), seconds, end=1000.0, now=0.0, pace=1.0) == ("8M", "rl", 2)
    assert study.next_cell(list(todo), seconds, end=1000.0, now=0.0, pace=2.0) is None
    assert study.next_cell(list(todo), seconds, end=1440.0, now=0.0, pace=2.0) == ("8M", "rl", 2)


def test_projected_seconds_from_a_running_cells_metrics(study, tmp_path):
    run = tmp_path / "rl_s1"
    run.mkdir()
    assert study.projected_seconds(run, "2M") is None  # no metrics yet
    lines = [{"step": 10 * i, "bytes": 500_000 * i, "bytes_per_s": 1000.0 * i} for i in (1, 2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert study.projected_seconds(run, "2M") is None  # two lines: still starting up
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"eval_bpb": 2.0}) + "\n")  # lines without a speed are skipped
        f.write(json.dumps({"step": 30, "bytes": 1_500_000, "bytes_per_s": 2500.0}) + "\n")
        f.write('{"step": 40, "by')  # a line being written
    assert study.projected_seconds(run, "2M") == 200.0  # 500,000 bytes left at 2,500 bytes/s


def test_a_stopped_cells_speed_sets_the_pace_of_the_next_pick(study, tmp_path):
    # the --pace guess was 1; the cell ran at 1,000 bytes/s, so its 2 MB would take 2,000 s against
    # an estimate of 500 s: pace 4, and the next 500 s cell no longer fits in 1,500 s
    run = tmp_path / "rl_s1"
    run.mkdir()
    assert study.stopped_cell_pace(run, "2M", 500.0) is None  # no metrics: no pace
    lines = [{"step": i, "bytes": 100_000 * i, "bytes_per_s": 1000.0} for i in (1, 2, 3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert study.stopped_cell_pace(run, "2M", None) is None  # no estimate: no pace
    pace = study.stopped_cell_pace(run, "2M", 500.0)
    assert pace == 4.0
    seconds = {("2M", "rl"): [500.0]}
    assert study.next_cell([("2M", "rl", 2)], seconds, end=1500.0, now=0.0, pace=1.0) == ("2M", "rl", 2)
    assert study.next_cell([("2M", "rl", 2)], seconds, end=1500.0, now=0.0,
                           pace=study.machine_pace([pace], prior=1.0)) is None


def test_run_after_a_stopped_cell_picks_at_that_cells_pace(study, tmp_path, monkeypatch):
    # through cmd_run's lane: the first cell is stopped at a measured pace of 4 (its 2 MB at 1,000
    # bytes/s against 500 s estimated); the second (500 s + 120 s to measure) fits in 1500 s at --pace
    # 1, not at 4
    import argparse

    monkeypatch.setattr(study, "OUT", tmp_path / "results")
    monkeypatch.setattr(study, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(study, "shared_bpe", lambda: tmp_path / "bpe.json")
    monkeypatch.setattr(study, "plan", lambda rungs, ablations: [("2M", "rl", 1), ("2M", "rl", 2)])
    monkeypatch.setattr(study, "cell_seconds", lambda: {("2M", "rl"): [500.0]})
    started = []

    def fake_watch(cmd, run_dir, rung, end, measure, **kw):
        started.append(run_dir.name)
        run_dir.mkdir(parents=True)
        lines = [{"step": i, "bytes": 100_000 * i, "bytes_per_s": 1000.0} for i in (1, 2, 3)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        return -15, "", "", True

    monkeypatch.setattr(study, "watch_cell", fake_watch)
    args = argparse.Namespace(rungs="2M", ablations=False, tags=None, jobs=1, hours=1500 / 3600, pace=1.0,
                              partial=False)
    assert study.cmd_run(args) == 0
    assert started == ["rl_s1"]


SLOW_CELL = """
import json, sys, time
run = sys.argv[1]
with open(run + "/metrics.jsonl", "w") as f:
    for i in range(1, 4):
        f.write(json.dumps({"step": i, "bytes": 1000 * i, "bytes_per_s": float(sys.argv[2])}) + "\\n")
print("training", flush=True)
time.sleep(float(sys.argv[3]))
print("done", flush=True)
"""


def test_a_cell_that_would_end_after_the_limit_is_stopped(study, tmp_path):
    import time

    run = tmp_path / "cell"
    run.mkdir()
    # 2 MB at 100 bytes/s: about 20,000 s more, far past an end 60 s away: stopped at the first look
    t0 = time.time()
    rc, out, _, stopped = study.watch_cell([sys.executable, "-c", SLOW_CELL, str(run), "100", "60"], run, "2M",
                                           end=time.time() + 60, measure=0.0, poll=0.5)
    assert stopped and rc != 0 and time.time() - t0 < 30 and out.startswith("training")
    # fast enough (2 MB at 10 MB/s) or no end: it runs to its end
    for end in (time.time() + 60, None):
        rc, out, _, stopped = study.watch_cell([sys.executable, "-c", SLOW_CELL, str(run), "1e7", "1"], run, "2M",
                                               end=end, measure=0.0, poll=0.3)
        assert (rc, stopped) == (0, False) and out.split() == ["training", "done"]
    # --partial: the same late cell trains on until the last look before the end (about 3 s here)
    t0 = time.time()
    rc, out, _, stopped = study.watch_cell([sys.executable, "-c", SLOW_CELL, str(run), "100", "60"], run, "2M",
                                           end=t0 + 3.5, measure=0.0, poll=0.5, partial=True)
    assert stopped and rc != 0 and 2.5 < time.time() - t0 < 30
    # late at every look, but fewer looks than asked for (a slow minute beside a test run): not stopped
    rc, out, _, stopped = study.watch_cell([sys.executable, "-c", SLOW_CELL, str(run), "100", "1"], run, "2M",
                                           end=time.time() + 60, measure=0.0, poll=0.2, looks=1000)
    assert (rc, stopped) == (0, False)


def test_a_cell_resumes_only_a_run_that_wrote_its_config(study, tmp_path, monkeypatch):
    # a cell stopped right after `rltok train` made its folder (only a lock in it) has nothing to
    # resume: `--resume` there fails ("is not a run"), so the cell must start it afresh
    monkeypatch.setattr(study, "RUNS", tmp_path / "runs")
    cmds = []
    monkeypatch.setattr(study.subprocess, "run", lambda cmd, **kw: cmds.append(cmd) or
                        study.subprocess.CompletedProcess(cmd, 0))
    run = study.run_path("32M", "rl", 3)
    run.mkdir(parents=True)
    (run / ".lock").write_text("1234\n")
    study.train_cell("32M", "rl", 3, tmp_path / "bpe.json")
    (run / "config.json").write_text("{}")
    study.train_cell("32M", "rl", 3, tmp_path / "bpe.json")
    assert ["--resume" in c for c in cmds] == [False, True]


def test_keep_run_files_commits_the_records_not_the_weights(study, tmp_path, monkeypatch):
    # what a finished cell leaves in results/study/runs: small JSON records, never checkpoints
    monkeypatch.setattr(study, "OUT", tmp_path / "out")
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for f in ("config.json", "summary.json", "metrics.jsonl", "tokenizer.info.json", "model.safetensors",
              "tokenizer.json"):
        (run / f).write_text(f)
    study.keep_run_files("2M", "bpe", 3, run)
    kept = tmp_path / "out" / "runs" / "2M" / "bpe_s3"
    assert sorted(p.name for p in kept.iterdir()) == [
        "config.json", "metrics.jsonl", "summary.json", "tokenizer.info.json"]
    assert (kept / "summary.json").read_text() == "summary.json"


def test_readme_block_is_each_row_minus_rl_of_the_same_seed_from_the_records(study, tmp_path):
    # 2 MB: uniform − rl = +0.02, +0.01, −0.01 per seed; 32 MB: +0.10, +0.12, +0.08 (hand-worked)
    cells = []
    for rung, gaps in (("2M", (0.02, 0.01, -0.01)), ("32M", (0.10, 0.12, 0.08))):
        for s, gap in zip((1, 2, 3), gaps):
            rl = 2.0 + 0.05 * s
            cells += [{**_cell("rl", "rl", s, rl), "rung": rung}, {**_cell("uniform", "uniform", s, rl + gap), "rung": rung},
                      {**_cell("bpe", "bpe", s, rl - 0.1, rate=0.25 + 0.01 * s, flops=10.165e6), "rung": rung}]
    block = study.readme_summary(cells)
    assert block.splitlines()[0].startswith("| 32 MB, 3 seeds each |")  # the top rung
    uniform = next(line for line in block.splitlines() if line.startswith("| uniform − rl |"))
    assert "+0.100 ± 0.012" in uniform  # mean +0.10, SE 0.02/sqrt(3)
    assert "| bpe (guidance, rate 0.270) − rl | −0.100 ± 0.000 |" in block  # its mean rate over seeds
    assert "2 MB +0.007" in block and "32 MB +0.100" in block and "in 5 of 6 seed pairs" in block
    with_matched = study.readme_summary(cells, matched=True)
    assert "| rate, FLOPs |" in with_matched  # uniform at r* and rl's FLOPs
    assert "| not rate (0.270), not FLOPs (+7%) |" in with_matched  # bpe: off r* (late rate 0.2 < its 0.27), 7% more
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{study.README_START}\nold\n{study.README_END}\nafter\n")
    assert study.write_readme_block(readme, block)
    assert readme.read_text() == f"before\n{study.README_START}\n{block}\n{study.README_END}\nafter\n"
