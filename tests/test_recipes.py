"""Named recipes: the paper's runs in one command each."""

import pytest

from rltok.cli import main
from rltok.config import RECIPES, build_config
from rltok.schema import config_keys
from rltok.errors import RltokError


@pytest.mark.parametrize("name", list(RECIPES))
def test_every_recipe_builds(name):
    cfg = build_config(None, None, name)
    assert cfg.recipe == name
    assert cfg.bytes_per_step == cfg.train.batch_size * cfg.model.seq_len


def test_paper_147m_recipe_is_the_paper_run():
    cfg = build_config(None, None, "paper-147m-fineweb")
    assert (cfg.method, cfg.preset) == ("rl", "147M")
    m, b, t = cfg.model, cfg.boundary, cfg.train
    assert (m.d_model, m.enc_layers, m.main_layers, m.dec_layers, m.seq_len) == (768, 4, 12, 4, 4096)
    assert t.batch_size == 128 and t.micro_batch == 8 and cfg.bytes_per_step == 524_288
    assert cfg.total_steps == 11_445 and t.lr == 1.5e-3 and t.warmup_bytes == 450_000_000
    assert (b.window, b.scale, b.gamma, b.baseline_group, b.target_rate) == (8, 0.0625, 0.99, 8, 0.2)
    assert (b.pg_weight, b.rate_weight, b.early_weight) == (0.01, 0.01, 0.1)
    assert cfg.data.packing == "document" and cfg.data.min_doc_bytes == 4096
    code = build_config(None, None, "paper-90m-codeparrot")
    assert code.preset == "90M-code" and code.train.total_bytes == 3_400_000_000 and code.train.lr == 2e-3


def test_ablations_differ_from_their_baseline_in_one_setting():
    base = build_config(None, None, "ablation-baseline").to_dict()
    expected = {"ablation-gamma1": ("boundary", "gamma", 1.0),
                "ablation-no-early-exit": ("boundary", "reward", "neg_ce"),
                "ablation-no-batch-relative": ("boundary", "baseline", "none"),
                "ablation-w1": ("boundary", "window", 1),
                "ablation-no-rate-penalty": ("boundary", "rate_weight", 0.0)}
    for name, (sec, key, value) in expected.items():
        d = build_config(None, None, name).to_dict()
        diffs = [k for k in config_keys(build_config(None, None, name))
                 if d[k.split(".")[0]][k.split(".")[1]] != base[k.split(".")[0]][k.split(".")[1]]]
        assert diffs == [f"{sec}.{key}"] and d[sec][key] == value, (name, diffs)


def test_explicit_preset_and_overrides_beat_the_recipe():
    cfg = build_config(None, "smoke", "ablation-w1")
    assert cfg.preset == "smoke" and cfg.model.d_model == 32 and cfg.boundary.window == 1
    cfg = build_config(None, None, "paper-147m-fineweb", overrides={"train.batch_size": 64})
    assert cfg.train.batch_size == 64 and cfg.train.batch_bytes == 0
    with pytest.raises(RltokError, match="unknown recipe"):
        build_config(None, None, "paper-1T")
    with pytest.raises(RltokError, match="multiple of model.seq_len"):
        build_config("rl", "smoke", overrides={"train.batch_bytes": 100})


def test_cli_recipe_list_keys(capsys):
    assert main(["train", "--recipe", "paper-147m-fineweb", "--list-keys", "--batch-bytes", "1048576"]) == 0
    out = capsys.readouterr().out
    assert "model.d_model = 768" in out and "train.batch_size = 256" in out
    assert "data.source = 'data/fineweb'" in out


def test_every_preset_applies_strictly_to_every_method_and_a_typo_is_refused(monkeypatch):
    """Presets hold model/train/data keys only and are applied strictly: every preset builds for
    every method, and a preset key that no config has is an error, not silently dropped."""
    from rltok import config as config_mod
    from rltok.errors import RltokError
    from rltok.methods import method_names
    from rltok.presets import PRESETS

    for preset in PRESETS:
        for method in method_names():
            config_mod.build_config(method, preset)
    monkeypatch.setitem(PRESETS, "tiny", {**PRESETS["tiny"], "model.d_modle": 8})
    with pytest.raises(RltokError, match="d_modle"):
        config_mod.build_config("rl", "tiny")
