"""The prose study's bookkeeping (tools/study_prose.py): the seeds per cell, the paired test that
decides every pre-registered comparison, and the summary built from cell records."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def sp():
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import study_prose as s
    finally:
        sys.path.pop(0)
    return s


def test_five_seeds_where_the_issue_asks(sp):
    cells = sp.plan(["2M", "8M", "32M"])
    def n(rung, tag):
        return sum(1 for c in cells if c[0] == rung and c[1] == tag)
    assert n("2M", "rl") == 3 and n("2M", "bpe-lm") == 3
    for rung in ("8M", "32M"):
        for tag in ("rl", "uniform", "nawrot", "hnet", "bpe", "rl-bpe-rate"):
            assert n(rung, tag) == 5
        assert n(rung, "rl-penalty") == 3 and n(rung, "bytes") == 3
    assert n("8M", "abl-gamma1") == 3 and n("32M", "abl-gamma1") == 0 and n("2M", "stride") == 0
    assert len(cells) == len(set(cells))
    # seed by seed: within a tier the first three seeds come before any fourth
    eight = [c for c in cells if c[0] == "8M" and c[1] in sp.CORE_8M]
    assert max(i for i, c in enumerate(eight) if c[2] == 3) < min(i for i, c in enumerate(eight) if c[2] == 4)


def test_rate_partner_trains_and_is_scored_at_its_partners_rates(sp, tmp_path, monkeypatch):
    """rl-bpe-rate waits for the rung's bpe seed-1 cell, then trains at that cell's late training
    rate and is matched on each evaluation set to bpe's rate on that set; other tags keep r*."""
    import json
    from types import SimpleNamespace

    monkeypatch.setattr(sp, "OUT", tmp_path)
    cfg = SimpleNamespace(boundary=SimpleNamespace(target_rate=0.2))
    assert not sp.ready("2M", "rl-bpe-rate") and sp.ready("2M", "rl")
    with pytest.raises(RuntimeError, match="bpe seed-1 cell first"):
        sp.train_overrides("2M", "rl-bpe-rate")
    rec = {"train_rate_late": 0.22898, **{k: {"rate": 0.2 + i / 100} for i, k in enumerate(sp.SETS)}}
    sp.cell_path("2M", "bpe", 1).parent.mkdir(parents=True)
    sp.cell_path("2M", "bpe", 1).write_text(json.dumps(rec))
    assert sp.ready("2M", "rl-bpe-rate") and not sp.ready("8M", "rl-bpe-rate")
    assert sp.train_overrides("2M", "rl-bpe-rate")[-1] == "boundary.target_rate=0.229"
    assert [sp.set_target("2M", "rl-bpe-rate", k, cfg) for k in sp.SETS] == pytest.approx([0.2, 0.21, 0.22, 0.23, 0.24])
    assert sp.set_target("2M", "rl", "docs_domain", cfg) == 0.2 and sp.train_overrides("2M", "rl") == sp.HOLD


def test_paired_test_hand_worked(sp):
    # differences 0.1, 0.2, 0.3: mean 0.2, sd 0.1, SE 0.1/sqrt(3); t = 2*sqrt(3) = 3.464 with 2 df
    t = sp.v2.paired_test([1.1, 1.2, 1.3], [1.0, 1.0, 1.0])
    assert t["mean"] == pytest.approx(0.2) and t["se"] == pytest.approx(0.1 / 3 ** 0.5)
    assert t["p"] == pytest.approx(0.0742, abs=5e-4)  # two-sided, t(2) at 3.464
    assert t["ci95"][0] < 0 < t["ci95"][1]  # p > 0.05: the interval holds 0
    assert sp.v2.paired_test([1.0], [0.5])["p"] is None


def _cell(tag, seed, bpb):
    ev = {"bpb": bpb, "rate": 0.2, "whitespace_recall": 0.8, "per_doc_bpb": [bpb], "docs": 1}
    return {"rung": "2M", "tag": tag, "method": tag, "seed": seed, "flops_per_byte_train": 9.5e6,
            "train_rate_late": 0.2, **{s: dict(ev) for s in ("test", "test512", "c4", "wikitext", "docs_domain")}}


def test_summary_pairs_by_seed_and_resolves_only_below_005(sp):
    cells = [_cell("uniform", s, 2.0 + 0.01 * s) for s in (1, 2, 3)]
    cells += [_cell("rl", s, 2.0 + 0.01 * s - d) for s, d in zip((1, 2, 3), (0.05, 0.06, 0.04))]
    cells += [_cell("nawrot", s, 2.0 + 0.01 * s + d) for s, d in zip((1, 2, 3), (0.05, -0.06, 0.02))]
    summ = sp.summarize(cells)["2M"]
    by = {(t["method"], t["reference"], t["set"]): t for t in summ["comparisons"]}
    u = by["rl", "uniform", "test"]
    assert u["mean"] == pytest.approx(-0.05) and u["resolved"] and u["p"] < 0.05
    n = by["rl", "nawrot", "test"]
    assert not n["resolved"]
    assert summ["rows"]["rl"]["test"]["bpb"] == pytest.approx(2.02 - 0.05)


def test_the_plan_runs_every_cell_once_with_the_comparisons_rows_first(sp):
    cells = sp.plan(["2M", "8M", "32M"])
    expected = {(r, t, s) for r in ("2M", "8M", "32M") for t in sp.LADDER[r] for s in sp.seeds(r, t)}
    assert len(cells) == len(set(cells)) and set(cells) == expected  # nothing dropped, nothing twice
    assert set(sp.CORE_8M) <= set(sp.LADDER["8M"])
    pos = {c: i for i, c in enumerate(cells)}
    last_core_8m = max(pos[c] for c in cells if c[0] == "8M" and c[1] in sp.CORE_8M)
    first_32m = min(pos[c] for c in cells if c[0] == "32M")
    last_32m = max(pos[c] for c in cells if c[0] == "32M")
    first_extra = min(pos[c] for c in cells if c[0] == "8M" and c[1] not in sp.CORE_8M + sp.DTYPE_CHECK)
    assert last_core_8m < first_32m and last_32m < first_extra
    # the dtype check (rl pinned to fp32, 3 seeds) runs before the 32 MB rung whose cells it qualifies
    check = [pos[("8M", "rl-fp32", s)] for s in (1, 2, 3)]
    assert last_core_8m < min(check) and max(check) < first_32m and ("8M", "rl-fp32", 4) not in pos
    assert pos[("8M", "abl-w8", 1)] > pos[("32M", "rl", 5)]
    # within a tier, seed by seed: seed 2 of any core row after seed 1 of every core row
    assert min(pos[("8M", t, 2)] for t in sp.CORE_8M) > max(pos[("8M", t, 1)] for t in sp.CORE_8M)
    assert sp.plan(["8M"])[0] == ("8M", "rl", 1)


def test_readme_block_is_the_largest_rung_with_every_planned_seed(sp, tmp_path):
    # 2M: every core row at its 3 seeds, rl better than uniform by 0.05, 0.06, 0.04 (mean 0.05,
    # SE 0.01/sqrt(3) = 0.0058, t = 8.66 with 2 df: p = 0.013); 8M: every core row at seeds 1-3,
    # short of the five the close comparisons need, so 8M is not complete and the README shows 2M
    cells = []
    for tag in sp.TOP:
        for s, d in zip((1, 2, 3), (0.05, 0.06, 0.04)):
            # nawrot scattered around the others (+0.05, -0.06, +0.02): nothing against it is resolved
            shift = {"rl": -d, "nawrot": (0.05, -0.06, 0.02)[s - 1]}.get(tag, 0.0)
            cells.append(_cell(tag, s, 2.0 + 0.01 * s + shift))
    cells += [{**_cell(t, s, 1.5), "rung": "8M"} for t in sp.CORE_8M for s in (1, 2, 3)]
    summ = sp.summarize(cells)
    assert sp.complete_rung(summ) == "2M"
    block = sp.readme_summary(summ)
    assert block.startswith("Prose study, 2M bytes per run")
    assert "| rl − uniform | 3 | -0.050 ± 0.006 | 0.013 | -0.050 ± 0.006 | 0.013 |" in block
    resolved = block.split("Resolved at p < 0.05:")[1]
    assert "rl − uniform (test)" in resolved and "nawrot" not in resolved
    assert "abl-" not in block and "entropy" not in block  # no ablation rows; entropy is not a 2M row
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n{sp.README_START}\nold table\n{sp.README_END}\nafter\n")
    assert sp.write_readme_block(readme, block)
    text = readme.read_text()
    assert "old table" not in text and block in text and text.startswith("# x\n\nbefore\n") and text.endswith("after\n")
    bare = tmp_path / "bare.md"
    bare.write_text("no markers\n")
    assert not sp.write_readme_block(bare, block) and bare.read_text() == "no markers\n"
    assert sp.readme_summary(sp.summarize(cells[27:])) == "The prose study has no complete rung yet."


def test_an_incomplete_comparison_is_pending_and_an_old_missed_rate_is_marked(sp):
    # 8 MB plans five seeds for rl and uniform: with three in, p < 0.05 is not yet a claim
    cells = [{**_cell("uniform", s, 2.0 + 0.01 * s), "rung": "8M"} for s in (1, 2, 3)]
    cells += [{**_cell("rl", s, 2.0 + 0.01 * s - d), "rung": "8M"} for s, d in zip((1, 2, 3), (0.05, 0.06, 0.04))]
    # rl seed 2 measured before score_at_rate: calibrated, no rate_match, 0.007 off r* on C4
    cells[4]["c4"] = {**cells[4]["c4"], "rate": 0.193, "calibrated": {"value": 1.0}}
    cells[5]["c4"] = {**cells[5]["c4"], "rate": 0.197, "calibrated": {"value": 1.0}}  # within 0.005
    summ = sp.summarize(cells)
    test = next(t for t in summ["8M"]["comparisons"] if (t["method"], t["reference"], t["set"]) == ("rl", "uniform", "test"))
    assert test["resolved"] and not test["complete"]
    assert "| rl − uniform | test | 3 |" in sp.tables(summ) and "pending (3 of 5 seeds) |" in sp.tables(summ)
    assert summ["8M"]["rows"]["rl"]["c4"]["missed_seeds"] == [2]
    row = next(line for line in sp.tables(summ).splitlines() if line.startswith("| rl | 3 |"))
    assert row.count("ᵐ") == 1  # on C4 only
    # rl − rl-penalty pairs the three seeds rl-penalty plans: with those in, rl's seeds 4 and 5
    # cannot change it, and it is a claim
    pen = [{**_cell("rl-penalty", s, 2.0 + 0.01 * s), "rung": "8M"} for s in (1, 2, 3)]
    t3 = next(t for t in sp.summarize(cells + pen)["8M"]["comparisons"]
              if (t["method"], t["reference"], t["set"]) == ("rl", "rl-penalty", "test"))
    assert t3["complete"] and t3["planned_seeds"] == [1, 2, 3]
    assert not next(t for t in sp.summarize(cells + pen[:2])["8M"]["comparisons"]
                    if (t["method"], t["reference"]) == ("rl", "rl-penalty"))["complete"]
    full = [{**c, "rung": "2M"} for c in cells]  # 2 MB plans three: the same test is a claim
    t2 = next(t for t in sp.summarize(full)["2M"]["comparisons"] if t["set"] == "test")
    assert t2["complete"] and "pending (" not in sp.tables(sp.summarize(full))


def test_flops_at_the_evaluation_rate_count_every_levels_rate_on_the_set(sp):
    from rltok.config import build_config
    from rltok.flops import training_flops_per_byte
    from rltok.run import build_model

    cfg = build_config("rl", "smoke", overrides={"model.stages": 2})
    model = build_model(cfg)
    at = sp.eval_flops_per_byte(model, cfg, {"rate": 0.25, "rates": [0.25, 0.6]})
    assert at == training_flops_per_byte(model, cfg, 0.25, [0.6]).per_byte
    assert at != training_flops_per_byte(model, cfg, 0.25).per_byte  # not the inner target
    one = build_config("rl", "smoke")
    m1 = build_model(one)
    assert sp.eval_flops_per_byte(m1, one, {"rate": 0.25, "rates": [0.25]}) == training_flops_per_byte(m1, one, 0.25).per_byte


def test_results_json_is_strict_json_with_null_where_a_byte_model_has_no_rate(sp):
    import json
    cells = [_cell("uniform", s, 2.0) for s in (1, 2, 3)]
    cells += [{**_cell("bytes", s, 2.4), "test": {**_cell("bytes", s, 2.4)["test"], "rate": float("nan")}} for s in (1, 2, 3)]
    text = sp.results_json({"test_segments_in_train": 0.001}, sp.summarize(cells), cells)

    def refuse(name):
        raise ValueError(f"not JSON: {name}")
    rec = json.loads(text, parse_constant=refuse)  # NaN / Infinity would raise here
    got = {(c["tag"], c["seed"]): c["test"]["rate"] for c in rec["cells"]}
    assert got[("bytes", 2)] is None and got[("uniform", 2)] == 0.2


def test_the_token_lms_do_not_set_the_delta_panels_scale(sp, tmp_path):
    # byte rows within ±0.03 of uniform, the BPE-token LM 0.6 below it: the Δ panel spans the byte
    # rows and shows the LM as an arrow at its lower edge, with its value and seeds in the legend
    cells = []
    for s in (1, 2, 3):
        jitter, lm = (0.0, 0.003, -0.003)[s - 1], (0.0, 0.004, -0.001)[s - 1]  # bpe-lm: Δ −0.599 ± 0.0015
        cells += [_cell("uniform", s, 2.30 + 0.01 * s), _cell("rl", s, 2.27 + 0.01 * s + jitter),
                  _cell("nawrot", s, 2.32 + 0.01 * s - jitter), _cell("bpe-lm", s, 1.70 + 0.01 * s + lm)]
    fig = sp.plot(sp.summarize(cells), cells, tmp_path / "ladder.png")
    ax = fig.axes[2]
    lo, hi = ax.get_ylim()
    assert -0.1 < lo < -0.03 and 0.02 < hi < 0.1
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "bpe-lm − uniform at 2M: -0.599 ± 0.002 (3 seeds), off scale" in labels, labels
    assert "rl − uniform" in labels and (tmp_path / "ladder.png").stat().st_size > 0


def test_the_second_figure_is_the_se_over_documents_of_the_seed_averaged_difference(sp):
    # two documents, two seeds: rl − uniform per document is (−0.1, −0.3) at seed 1 and (−0.3, −0.1)
    # at seed 2, so (−0.2, −0.2) averaged over seeds: SE over documents 0; a third document
    # at (0, 0) makes it (−0.2, −0.2, 0): SE = std(ddof=1)/sqrt(3) = 0.11547/1.732 = 0.06667
    def cell(tag, seed, docs):
        c = _cell(tag, seed, sum(docs) / len(docs))
        c["test"] = {**c["test"], "per_doc_bpb": docs, "docs": len(docs)}
        return c
    u = [cell("uniform", 1, [2.0, 2.0]), cell("uniform", 2, [2.0, 2.0])]
    r = [cell("rl", 1, [1.9, 1.7]), cell("rl", 2, [1.7, 1.9])]
    t = next(t for t in sp.summarize(u + r)["2M"]["comparisons"] if t["set"] == "test" and t["reference"] == "uniform")
    assert t["se_docs"] == pytest.approx(0.0) and t["docs"] == 2 and t["mean_docs"] == pytest.approx(-0.2)
    u = [cell("uniform", 1, [2.0, 2.0, 2.0]), cell("uniform", 2, [2.0, 2.0, 2.0])]
    r = [cell("rl", 1, [1.9, 1.7, 2.0]), cell("rl", 2, [1.7, 1.9, 2.0])]
    summ = sp.summarize(u + r)
    t = next(t for t in summ["2M"]["comparisons"] if t["set"] == "test" and t["reference"] == "uniform")
    assert t["se_docs"] == pytest.approx(0.11547005 / 3 ** 0.5) and t["docs"] == 3
    assert "| rl − uniform | test | 2 |" in sp.tables(summ) and "0.0667 (3) |" in sp.tables(summ)


def test_a_flat_lm_costs_its_training_flops_on_every_set_and_unmatched_pairs_are_said(sp):
    cells = []
    for s in (1, 2, 3):
        b = _cell("bytes", s, 2.5)
        for ev in ("test", "test512", "c4", "wikitext", "docs_domain"):
            b[ev] = {**b[ev], "rate": float("nan")}
        b["flops_per_byte_train"] = 9.53e6
        rl = _cell("rl", s, 2.3 + 0.01 * s)
        rl["test"] = {**rl["test"], "flops_per_byte": 9.4e6}
        bpe = _cell("bpe", s, 2.28 + 0.01 * s)
        bpe["test"] = {**bpe["test"], "rate": 0.224}
        bpe["flops_per_byte_train"] = 9.9e6
        cells += [b, rl, bpe]
    rows = sp.summarize(cells)["2M"]["rows"]
    assert rows["bytes"]["test"]["flops_per_byte"] == pytest.approx(9.53e6)
    assert rows["rl"]["test"]["flops_per_byte"] == pytest.approx(9.4e6)
    assert rows["rl"]["c4"]["flops_per_byte"] is None  # a row with a rate is never given its training figure
    assert sp._unmatched(rows, "rl", "bpe") == "rl − bpe: rate on test 0.200 vs 0.224"  # FLOPs within 5%
    assert sp._unmatched(rows, "rl", "bytes") is None  # no rate to compare, FLOPs equal


def test_the_tables_say_what_the_corpus_is_from_the_leakage_record(sp):
    leak = {"mixture": {"gutenberg": 0.5787, "wikipedia": 0.4213}, "test_segments_in_train": 0.00089,
            "splits": {s: {"gutenberg": {"docs": 2, "bytes": 2e6}, "wikipedia": {"docs": 8, "bytes": 1e6},
                           "total": {"docs": 10, "bytes": 3e6}} for s in ("test", "val")}}
    text = sp.corpus_lines(leak)
    assert "gutenberg 57.9%, wikipedia 42.1%" in text and "wikipedia 8 documents (1.0 MB)" in text and "0.089%" in text
    assert sp.corpus_lines({}) == ""


def test_the_tables_count_each_rungs_cells_by_the_dtype_their_run_summaries_record(sp, tmp_path):
    import json
    for key, dtype in (("32M/rl_s1", "fp32"), ("32M/rl_s2", "bf16"), ("32M/uniform_s1", "bf16")):
        (tmp_path / "runs" / key).mkdir(parents=True)
        (tmp_path / "runs" / key / "summary.json").write_text(json.dumps({"finished": True, "dtype": dtype}))
    cells = [{"rung": "32M", "tag": t, "seed": s} for t, s in (("rl", 1), ("rl", 2), ("uniform", 1), ("bpe", 1))]
    cells.append({"rung": "8M", "tag": "rl", "seed": 1})
    text = sp.dtype_lines(cells, tmp_path)
    assert "8M: 1 no summary; 32M: 2 bf16, 1 fp32, 1 no summary." in text
    assert sp.dtype_lines([], tmp_path) == ""


def test_the_dtype_check_pairs_rl_fp32_with_rl_and_is_marked_not_preregistered(sp):
    cells = [{**_cell(t, s, b + 0.001 * s), "rung": "8M"} for t, b in (("rl", 2.0), ("rl-fp32", 2.01)) for s in (1, 2, 3)]
    tests = [t for t in sp.summarize(cells)["8M"]["comparisons"] if t["set"] == "test"]
    assert [(t["method"], t["reference"], t["preregistered"]) for t in tests] == [("rl-fp32", "rl", False)]
    assert abs(tests[0]["mean"] - 0.01) < 1e-9 and tests[0]["complete"]
    assert "rl-fp32 − rl (check, added later) | test" in sp.tables(sp.summarize(cells))
    assert "train.dtype=fp32" in sp.variants()["rl-fp32"][1]
