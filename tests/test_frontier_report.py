"""Issue 38's frontier report (results/rates/frontier_report.py) on a record worked by hand: the
best rl rate per budget and which rates a paired test over seeds cannot tell from it, the options
against rl at 0.2, and the plot."""

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture()
def fr():
    spec = importlib.util.spec_from_file_location("frontier_report", REPO / "results" / "rates" / "frontier_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(size, tag, rate, seed, bpb):
    return {"bytes": size, "tag": tag, "requested_rate": rate, "seed": seed, "bpb": bpb, "rate": rate or 0.2,
            "flops_per_byte": 1e7 * (1 + (rate or 0.2)), "flops_per_byte_train": 1e7 * (1 + (rate or 0.2)),
            "whitespace_recall": 0.9, "boundary_enrichment": 2.0}


def test_the_best_rl_rate_and_the_rates_not_resolved_from_it(fr, tmp_path):
    # 8M: rl at 0.2 is best (3.00, 3.01, 3.02); 0.3 is worse by exactly 0.01 at every seed (resolved,
    # p = 0); 0.1 is worse by 0.01, 0.03, -0.01 (mean 0.01, not resolved)
    rows = []
    for s, base in zip((1, 2, 3), (3.00, 3.01, 3.02)):
        rows += [_row("8M", "rl_r0.2", 0.2, s, base), _row("8M", "rl_r0.3", 0.3, s, base + 0.01),
                 _row("8M", "rl_r0.1", 0.1, s, base + (0.01, 0.03, -0.01)[s - 1]),
                 _row("8M", "uniform_r0.2", 0.2, s, base + 0.05), _row("8M", "opt_mean_pool", 0.2, s, base + 0.02 * s),
                 _row("2M", "rl_r0.2", 0.2, s, base + 0.5), _row("2M", "rl_r0.1", 0.1, s, base + 0.4)]
    text, summary = fr.tables({"rows": rows})
    assert summary["8M:best_rl_rate"] == 0.2 and summary["2M:best_rl_rate"] == 0.1
    assert summary["8M:rl_rates_not_resolved_from_best"] == [0.1]
    assert summary["2M:rl_rates_not_resolved_from_best"] == []  # 0.1 better by 0.1 at every seed
    # uniform is not an rl rate; the option is paired with rl at 0.2 seed by seed: +0.02, +0.04, +0.06
    assert "uniform" not in str(summary["8M:rl_rates_not_resolved_from_best"])
    t = summary["8M:opt_mean_pool:vs_rl"]
    assert t["per_seed"] == pytest.approx([0.02, 0.04, 0.06]) and t["se"] == pytest.approx(0.02 / 3 ** 0.5)
    assert t["p_holm"] == pytest.approx(t["p"])  # the only option: Holm over one test leaves it
    assert "Best rl rate at 8M: 0.2 (3.0100 ± 0.0058 bits/byte)" in text
    assert "| 0.3 | 3 | +0.0100 | 0.0000 | 0 | 0 |" in text
    assert "Not resolved from the best at Holm-adjusted p < 0.05: 0.1." in text
    fr.plot({"rows": rows}, tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 10_000


def test_holm_adjustment_worked_by_hand(fr):
    # sorted 0.01, 0.03, 0.04 of three tests: x3 = 0.03, x2 = 0.06, x1 = 0.04 -> kept monotone: 0.06
    assert fr.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": None}) == pytest.approx(
        {"a": 0.03, "b": 0.06, "c": 0.06, "d": None})
    assert fr.holm({"a": 0.6, "b": 0.7}) == {"a": 1.0, "b": 1.0}  # capped at 1


def test_rates_resolved_only_after_adjusting_for_the_chosen_best(fr):
    # rl at 0.2 is best; paired t against it: 0.4 p = 0.0351, 0.3 p = 0.0371, 0.1 p = 0.0742 (scipy
    # ttest_rel). Two are below 0.05 unadjusted; Holm over three: 0.105, 0.0742 -> 0.105, 0.0742 ->
    # 0.105: none is resolved from the best
    from scipy import stats

    base, diff = (3.00, 3.01, 3.02), {0.4: (0.02, 0.03, 0.04), 0.3: (0.01, 0.02, 0.014), 0.1: (0.01, 0.03, 0.02)}
    rows = [_row("8M", "rl_r0.2", 0.2, s, b) for s, b in zip((1, 2, 3), base)]
    rows += [_row("8M", f"rl_r{r}", r, s, b + d) for r, ds in diff.items() for s, b, d in zip((1, 2, 3), base, ds)]
    text, summary = fr.tables({"rows": rows})
    raw = {r: stats.ttest_rel([b + x for b, x in zip(base, d)], base).pvalue for r, d in diff.items()}
    assert sorted(raw.values())[:2] == pytest.approx([0.0351, 0.0371], abs=1e-4)
    assert summary["8M:best_rl_rate"] == 0.2
    assert summary["8M:rl_rates_not_resolved_from_best"] == [0.1, 0.3, 0.4]
    assert "| 0.4 | 3 | +0.0300 | 0.0058 | 0.0351 | 0.105 |" in text


def test_the_best_rate_at_equal_compute_is_not_the_best_at_equal_bytes(fr, tmp_path):
    # rl at 0.2 is 0.01 better than 0.1 at both budgets, but costs 1.2e7 FLOPs per byte against 1.1e7.
    # Training compute: 0.1 spans 2.2e13 (2M) to 8.8e13 (8M), 0.2 spans 2.4e13 to 9.6e13; both are
    # read over [2.4e13, 8.8e13]. At 2.4e13, 0.1 is at log(2.4/2.2)/log(4) = 0.06277 of its way from
    # 3.00 to 2.60: 2.97489, below 0.2's 2.99 by 0.01511; at 8.8e13 0.2 has come 0.93723 of its way
    # from 2.99 to 2.59: 2.61511, above 0.1's 2.60 by the same. Equal seed offsets: p = 0.
    rows = []
    for s in (1, 2, 3):
        rows += [_row("2M", "rl_r0.1", 0.1, s, 3.00 + s / 1000), _row("8M", "rl_r0.1", 0.1, s, 2.60 + s / 1000),
                 _row("2M", "rl_r0.2", 0.2, s, 2.99 + s / 1000), _row("8M", "rl_r0.2", 0.2, s, 2.59 + s / 1000),
                 _row("8M", "uniform_r0.2", 0.2, s, 2.0)]  # not rl: not on a curve
    text, summary = fr.tables({"rows": rows})
    assert summary["2M:best_rl_rate"] == 0.2 and summary["8M:best_rl_rate"] == 0.2  # at equal bytes
    eq = summary["equal_compute"]
    assert [e["flops"] for e in eq] == pytest.approx([2.4e13, (2.4e13 * 8.8e13) ** 0.5, 8.8e13])
    assert [e["best_rl_rate"] for e in eq] == [0.1, 0.1, 0.1]
    assert all(e["rl_rates_not_resolved_from_best"] == [] for e in eq)
    assert text.count("| 0.2 | 3 | 2.9920 ± 0.0006 | +0.0151 | 0.0000 | 0 |") == 1  # at 2.4e13, 0.2 at its 2M point
    assert "At 2.4e+13 training FLOPs: best rate 0.1 (2.9769 ± 0.0006 bits/byte)" in text
    assert "At 8.8e+13 training FLOPs: best rate 0.1 (2.6020 ± 0.0006 bits/byte)" in text
    fr.plot({"rows": rows}, tmp_path / "f.png")  # two budget panels and the compute panel
    assert (tmp_path / "f.png").stat().st_size > 10_000


def test_one_measured_rate_is_not_called_the_best(fr):
    # a budget with rl at one rate so far has no best rate to report, not a "best" with no rivals
    rows = [_row("32M", "rl_r0.2", 0.2, s, 2.0 + s / 100) for s in (1, 2, 3)]
    text, summary = fr.tables({"rows": rows})
    assert summary["32M:best_rl_rate"] is None
    assert "Best rl rate at 32M: not yet asked (only rate 0.2 measured)." in text
    assert "Not resolved from the best" not in text


def test_the_frontier_reads_rl_at_0_2_from_the_prose_study_at_every_rung_it_has(tmp_path, monkeypatch):
    """frontier.py does not train again what the prose study measured the same way: its rl, uniform
    and bpe-lm cells at each of its rungs (2M too: the budget trend's first point); a cell measured
    before score_at_rate existed is labelled by whether it was calibrated."""
    import sys
    monkeypatch.syspath_prepend(str(REPO / "results" / "rates"))
    import frontier

    cells = tmp_path / "cells"
    (cells / "2M").mkdir(parents=True)
    test = {"rate": 0.199, "bpb": 3.0, "bpb_se": 0.02, "docs": 1000, "bytes": 123, "calibrated": True,
            "flops_per_byte": 9.5e6}
    (cells / "2M" / "rl_s1.json").write_text(__import__("json").dumps({"test": test, "flops_per_byte_train": 9e6}))
    monkeypatch.setattr(frontier, "STUDY_CELLS", cells)
    monkeypatch.setattr(frontier, "ROOT", tmp_path / "frozen-worktree")  # the cells lie outside it
    p = frontier.study_point("2M", "rl_r0.2", 1)
    assert p["requested_rate"] == 0.2 and p["bpb"] == 3.0 and p["rate_match"] == "calibrated"
    assert p["flops_per_byte"] == 9.5e6 and p["from"] == "prose study cells/2M/rl_s1.json"
    assert p["flops_per_byte_train"] == 9e6  # what it cost to train, beside the cost at the test rate
    assert frontier.study_point("2M", "rl_r0.2", 2) is None  # not yet measured: the frontier waits
    assert "rl" in frontier.LADDER["2M"] and "bpe-lm-neox" not in frontier.LADDER["2M"]
    sys.modules.pop("frontier", None)


def test_extra_rates_extend_the_fixed_rate_rows_not_the_conditioned_models_scoring(monkeypatch):
    """`--rates 0.05` asks for rl and uniform at a rate past RATES' edge (where the best rate sits at
    equal compute); the conditioned model is still scored only inside the range it was trained on."""
    import sys
    monkeypatch.syspath_prepend(str(REPO / "results" / "rates"))
    import frontier

    runs = frontier.runs_of(["rl", "uniform", "cond"], [], "8M", rates=(0.05,))
    assert set(runs) == {"rl_r0.05", "uniform_r0.05", "cond"}
    assert runs["rl_r0.05"][2] == (0.05,) and "boundary.target_rate=0.05" in runs["rl_r0.05"][1]
    assert runs["uniform_r0.05"][1] == ["boundary.target_rate=0.05"]
    assert runs["cond"][2] == frontier.RATES
    assert set(frontier.runs_of(["rl"], [], "8M")) == {f"rl_r{r:g}" for r in frontier.RATES}
    sys.modules.pop("frontier", None)


def test_every_seed_and_budget_gets_every_requested_rate(tmp_path, monkeypatch):
    """main() walks seeds × budgets × rows: each seed and budget trains rl at every rate of
    `--rates` (a loop variable once shadowed the parsed rates, so the second seed got only the rates
    the first seed's last row was scored at). Training and measuring are stubbed: this is the plan."""
    import sys
    monkeypatch.syspath_prepend(str(REPO / "results" / "rates"))
    import frontier

    trained = []
    monkeypatch.setattr(frontier, "train", lambda run, method, sets, size, seed: trained.append(run.name))
    monkeypatch.setattr(frontier, "measure", lambda run, rate, docs=None: {
        "requested_rate": rate, "rate": rate or 0.2, "bpb": 2.0, "flops_per_byte": 9e6, "flops_per_byte_train": 9e6})
    monkeypatch.setattr(frontier, "STUDY_CELLS", tmp_path / "cells")  # none: the study's points wait
    monkeypatch.setattr(sys, "argv", ["frontier.py", "--bytes", "2M,8M", "--rows", "rl,hinge", "--rates", "0.05,0.3",
                                      "--seeds", "1,2", "--out", str(tmp_path / "runs"),
                                      "--record", str(tmp_path / "frontier.json")])
    assert frontier.main() == 0
    want = [f"{tag}_s{seed}" for seed in (1, 2) for _ in ("2M", "8M") for tag in ("rl_r0.05", "rl_r0.3", "hinge")]
    assert trained == want
    rows = __import__("json").loads((tmp_path / "frontier.json").read_text())["rows"]
    assert sorted({(r["bytes"], r["tag"], r["seed"]) for r in rows}) == sorted(
        {(b, t, s) for s in (1, 2) for b in ("2M", "8M") for t in ("rl_r0.05", "rl_r0.3", "hinge")})
    sys.modules.pop("frontier", None)


def test_the_best_rate_is_picked_from_the_seeds_every_rate_has(fr):
    # 0.4 has seed 1 only, where it is worse than 0.3 (2.90 vs 2.89); seed 2 of 0.3 is high (2.96), so
    # over their own seeds 0.4 (2.900) would rank ahead of 0.3 (2.925): ranked over seed 1, 0.3 leads
    rows = [_row("8M", "rl_r0.3", 0.3, 1, 2.89), _row("8M", "rl_r0.3", 0.3, 2, 2.96), _row("8M", "rl_r0.4", 0.4, 1, 2.90)]
    text, summary = fr.tables({"rows": rows})
    assert summary["8M:best_rl_rate"] == 0.3
    assert "Best rl rate at 8M: 0.3 (2.9250 ± 0.0350 bits/byte; picked by the means over seed 1, which every rate has)" in text
    rows = [_row("8M", "rl_r0.3", 0.3, 2, 2.96), _row("8M", "rl_r0.4", 0.4, 1, 2.90)]  # no shared seed
    text, summary = fr.tables({"rows": rows})
    assert summary["8M:best_rl_rate"] is None and "no seed has every rate" in text


def test_the_frontier_is_drawn_at_training_flops_and_old_rows_are_filled_in_from_their_runs(fr, tmp_path, monkeypatch):
    """A conditioned model costs one training budget whatever rate it is scored at: its points share
    their training FLOPs per byte (the table's column and the compute axis), and the FLOPs at the
    test rate stand beside them. Rows recorded before the field existed are filled in at start."""
    import json
    import sys
    rows = [{**_row("8M", "cond", r, 1, 2.3), "flops_per_byte": 1e7 * r, "flops_per_byte_train": 1.01e7}
            for r in (0.1, 0.4)]
    text, _ = fr.tables({"rows": rows})
    assert "| cond | 0.1 | 1 | 2.3000 | 0.100 | 10.10M | 1.00M |" in text
    assert "| cond | 0.4 | 1 | 2.3000 | 0.400 | 10.10M | 4.00M |" in text
    assert fr.total_flops(rows[1]) == pytest.approx(8e6 * 1.01e7)
    monkeypatch.syspath_prepend(str(REPO / "results" / "rates"))
    import frontier

    cells = tmp_path / "cells" / "8M"
    cells.mkdir(parents=True)
    (cells / "rl_s1.json").write_text(json.dumps({"flops_per_byte_train": 9.5e6, "train_rate": 0.201}))
    (tmp_path / "runs" / "8M" / "cond_s1").mkdir(parents=True)
    (tmp_path / "runs" / "8M" / "cond_s1" / "summary.json").write_text("{}")
    monkeypatch.setattr(frontier, "STUDY_CELLS", tmp_path / "cells")
    loads = []
    monkeypatch.setattr(frontier, "train_compute", lambda run, model=None: loads.append(run.name) or
                        {"flops_per_byte_train": 1.01e7, "train_rate": 0.25})
    old = [{"bytes": "8M", "tag": "cond", "seed": 1, "requested_rate": r, "flops_per_byte": 1e7 * r} for r in (0.1, 0.4)]
    old += [{"bytes": "8M", "tag": "rl_r0.2", "seed": 1, "requested_rate": 0.2, "from": "prose study cells/8M/rl_s1.json"},
            {"bytes": "8M", "tag": "hinge", "seed": 2, "requested_rate": None}]  # its run is gone
    rec = {"rows": old}
    assert frontier.backfill_train_compute(rec, tmp_path / "runs") == ["8M hinge s2"]
    assert loads == ["cond_s1"]  # one run, read once for both of its points
    assert [r.get("flops_per_byte_train") for r in rec["rows"]] == [1.01e7, 1.01e7, 9.5e6, None]
    assert rec["rows"][2]["train_rate"] == 0.201
    record = tmp_path / "f.json"
    record.write_text(json.dumps(rec))
    monkeypatch.setattr(sys, "argv", ["frontier_report.py", "--record", str(record), "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="rows without flops_per_byte_train .8M hinge s2."):
        fr.main()
    # a fixed-rate row whose run is gone: its kept records first, else its settings at its rate
    kept = tmp_path / "kept" / "2M" / "rl_r0.3_s1"
    kept.mkdir(parents=True)
    (kept / "summary.json").write_text("{}")
    rows = [{"bytes": "2M", "tag": t, "seed": 1, "requested_rate": r, "method": m, "overrides": o}
            for t, r, m, o in (("rl_r0.3", 0.3, "rl", []), ("uniform_r0.1", 0.1, "uniform", ["boundary.target_rate=0.1"]))]
    loads.clear()
    assert frontier.backfill_train_compute({"rows": rows}, tmp_path / "runs", tmp_path / "kept") == []
    assert loads == ["rl_r0.3_s1"] and "train_compute_from" not in rows[0]
    from rltok.config import build_config
    from rltok.flops import training_flops_per_byte
    from rltok.run import build_model
    cfg = build_config("uniform", "tiny", overrides={"boundary.target_rate": "0.1"})
    assert rows[1]["flops_per_byte_train"] == pytest.approx(training_flops_per_byte(build_model(cfg), cfg, 0.1).per_byte)
    assert "records are gone" in rows[1]["train_compute_from"]
    sys.modules.pop("frontier", None)


def test_a_bpe_token_lm_far_below_does_not_set_the_byte_models_axis(fr, tmp_path):
    # byte models at 2.30-2.36, the BPE-token LM at 1.78: the 8M panel spans the byte models and
    # shows the LM as an arrow at its lower edge, its value in the legend
    rows = []
    for s in (1, 2, 3):
        rows += [_row("8M", "rl_r0.2", 0.2, s, 2.34 + 0.01 * s), _row("8M", "uniform_r0.2", 0.2, s, 2.30 + 0.01 * s),
                 _row("8M", "bpe-lm", None, s, 1.78)]
    fig = fr.plot({"rows": rows}, tmp_path / "f.png")
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    assert 2.2 < lo < 2.314 and hi > 2.36  # uniform: 2.32 ± 0.006; rl: 2.36 ± 0.006
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(t.startswith("bpe-lm: 1.7800") and "off scale" in t for t in labels), labels


def test_uniform_and_the_conditioned_model_against_rl_at_each_rate(fr):
    # uniform is rl + 0.05 at 0.2 on every seed (p = 0) and rl + (0.01, 0.03, -0.01) at 0.1; the
    # conditioned model is read at 0.2 only; bpe-lm (no rate) is in neither table
    rows = []
    for s, base in zip((1, 2, 3), (3.00, 3.01, 3.02)):
        rows += [_row("8M", "rl_r0.2", 0.2, s, base), _row("8M", "rl_r0.1", 0.1, s, base + 0.1),
                 _row("8M", "uniform_r0.2", 0.2, s, base + 0.05),
                 _row("8M", "uniform_r0.1", 0.1, s, base + 0.1 + (0.01, 0.03, -0.01)[s - 1]),
                 _row("8M", "cond", 0.2, s, base - 0.01 * s), _row("8M", "bpe-lm", None, s, 1.8)]
    text, summary = fr.tables({"rows": rows})
    u2, u1, c2 = summary["8M:uniform:0.2:vs_rl"], summary["8M:uniform:0.1:vs_rl"], summary["8M:cond:0.2:vs_rl"]
    assert u2["mean"] == pytest.approx(0.05) and u2["p"] == 0 and u2["p_holm"] == 0
    assert u1["mean"] == pytest.approx(0.01) and u1["se"] == pytest.approx(0.02 / 3 ** 0.5)
    assert u1["p_holm"] == pytest.approx(u1["p"])  # Holm: the larger of two p-values is multiplied by 1
    assert c2["per_seed"] == pytest.approx([-0.01, -0.02, -0.03])
    assert "8M:cond:0.1:vs_rl" not in summary and not any(k.startswith("8M:bpe-lm") and "vs_rl" in k for k in summary)
    assert "uniform − rl at the same requested rate (8M" in text and "| 0.2 | 3 | +0.0500 | 0.0000 | 0 | 0 |" in text
