"""Training end to end on the smoke preset: outputs, resume, the rate controller."""

import json

import pytest
import torch

from rltok.methods import get_method
from rltok.config import build_config
from rltok.data.loader import SequenceDataset
from rltok.objectives import training_loss
from rltok.run import load_model
from rltok.checkpoint import load_tensors as load_weights
from rltok.train import train


def _cfg(path, method="rl", **over):
    return build_config(method, "smoke", overrides={"data.source": str(path), "train.eval_docs": 4, **over})


def test_run_directory_contents(small_corpus_file, tmp_path):
    res = train(_cfg(small_corpus_file), tmp_path / "run", progress=False)
    run = tmp_path / "run"
    for f in ("config.json", "model.safetensors", "metrics.jsonl", "summary.json"):
        assert (run / f).is_file()
    assert res.summary["finished"] and res.summary["steps"] == 12
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    step_lines = [r for r in lines if "event" not in r]
    assert [r["step"] for r in step_lines] == [2, 4, 6, 8, 10, 12]
    for key in ("loss", "bpb", "bpb_early", "rate", "whitespace_recall", "adv_mean", "adv_std",
                "logp_mean", "entropy", "grad_norm", "bytes_per_s", "lr"):
        assert key in step_lines[-1], key
    assert any(r.get("event") == "final_eval" for r in lines)
    model = load_model(run)
    assert model.run_config.method == "rl"


@pytest.mark.parametrize("method,over", [("rl", {}), ("uniform", {}), ("rl", {"model.stages": 2})],
                         ids=["rl", "uniform", "rl-two-stage"])
def test_resume_reaches_identical_weights(small_corpus_file, tmp_path, method, over):
    cfg = _cfg(small_corpus_file, method, **{"train.ckpt_every": 4, **over})
    straight = train(cfg, tmp_path / "a", progress=False)
    stopped = train(_cfg(small_corpus_file, method, **{"train.ckpt_every": 4, **over}), tmp_path / "b",
                    progress=False, stop_at_step=5)
    assert stopped.exit_code == 130 and stopped.steps == 5
    resumed = train(_cfg(small_corpus_file, method, **over), tmp_path / "b", resume=True, progress=False)
    assert resumed.steps == straight.steps == 12
    wa = load_weights(tmp_path / "a" / "model.safetensors")
    wb = load_weights(tmp_path / "b" / "model.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    steps = [json.loads(x).get("step") for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
             if "event" not in json.loads(x)]
    assert steps == sorted(set(steps))  # no duplicated lines after resuming


def test_resumed_run_counts_earlier_training_seconds(small_corpus_file, tmp_path, monkeypatch):
    """A run stopped and resumed reports the training time of both legs. The first leg runs on a
    clock that moves 100 s a reading, so its seconds dwarf the resumed leg's real ones: a summary
    that counted only the last leg would be far below the checkpoint's."""
    import itertools
    import time as real_time
    import rltok.train as train_mod
    from rltok.checkpoint import load_latest_checkpoint

    ticks = itertools.count(step=100.0)
    fake = type("FakeTime", (), {"perf_counter": staticmethod(lambda: next(ticks)),
                                 "time": staticmethod(real_time.time), "sleep": staticmethod(real_time.sleep)})
    monkeypatch.setattr(train_mod, "time", fake)
    train(_cfg(small_corpus_file, **{"train.ckpt_every": 4}), tmp_path / "r", progress=False, stop_at_step=5)
    monkeypatch.setattr(train_mod, "time", real_time)
    first = load_latest_checkpoint(tmp_path / "r")[3]["train_seconds"]
    assert first >= 100
    resumed = train(_cfg(small_corpus_file), tmp_path / "r", resume=True, progress=False)
    assert first <= resumed.summary["train_seconds"] < first + 100
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["elapsed_s"] >= first for r in lines if "event" not in r and r["step"] > 5)


def test_existing_run_needs_resume(small_corpus_file, tmp_path):
    from rltok.errors import RltokError

    train(_cfg(small_corpus_file), tmp_path / "r", progress=False)
    with pytest.raises(RltokError, match="already holds a run"):
        train(_cfg(small_corpus_file), tmp_path / "r", progress=False)


def test_resume_needs_a_run_not_just_its_folder(small_corpus_file, tmp_path):
    # a run stopped before it wrote config.json leaves a folder with only its lock: --resume
    # names the missing config, and a fresh train in that folder goes ahead
    from rltok.errors import RltokError

    (tmp_path / "r").mkdir()
    (tmp_path / "r" / ".lock").write_text("1234\n")
    with pytest.raises(RltokError, match=r"--resume: .* is not a run \(no config.json\)"):
        train(_cfg(small_corpus_file), tmp_path / "r", resume=True, progress=False)
    train(_cfg(small_corpus_file), tmp_path / "r", progress=False)
    assert (tmp_path / "r" / "config.json").is_file()


def test_rate_penalty_drives_rate_to_target(small_corpus_file):
    """Start the policy far above the target (rate ~0.95) and train briefly: the achieved rate
    must come down to r* = 0.2."""
    cfg = _cfg(small_corpus_file, **{"boundary.rate_weight": 1.0, "boundary.pg_weight": 0.0})
    torch.manual_seed(0)
    model = get_method("rl").build(cfg, None)
    with torch.no_grad():
        model.boundary.proj.bias.fill_(4.5)
    from rltok.data.sources import load_corpus

    ds = SequenceDataset(load_corpus(str(small_corpus_file)), cfg.model.seq_len, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    rates = []
    for step in range(60):
        sl = training_loss(model, ds.batch(ds.step_indices(step, 8)), cfg)
        opt.zero_grad()
        sl.loss.backward()
        opt.step()
        rates.append(float(sl.stats["n_boundary"] / sl.stats["n_valid"]))
    assert rates[0] > 0.8
    assert abs(sum(rates[-10:]) / 10 - 0.2) < 0.03


@pytest.mark.parametrize("start", [0.05, 0.95])
def test_hnet_threshold_control_holds_the_target_rate(small_corpus_file, start):
    """H-Net with rate_control=threshold, started with a threshold far too low (rate near 1) or
    far too high (rate near 0), is brought to r* = 0.2 within a few dozen steps; without it the
    rate stays where the routing puts it."""
    from rltok.data.sources import load_corpus

    def rates(control):
        cfg = _cfg(small_corpus_file, "hnet", **{"boundary.threshold": start, "boundary.rate_control": control,
                                                 "boundary.control_gain": 0.2})
        torch.manual_seed(0)
        model = get_method("hnet").build(cfg, None)
        ds = SequenceDataset(load_corpus(str(small_corpus_file)), cfg.model.seq_len, seed=0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        out = []
        for step in range(60):
            sl = training_loss(model, ds.batch(ds.step_indices(step, 8)), cfg)
            opt.zero_grad()
            sl.loss.backward()
            opt.step()
            out.append(float(sl.stats["n_boundary"] / sl.stats["n_valid"]))
        return out, model

    held, model = rates("threshold")
    assert abs(sum(held[-10:]) / 10 - 0.2) < 0.03
    assert "stage.router.threshold" in model.state_dict()  # saved with the weights
    free, _ = rates("")
    assert abs(sum(free[-10:]) / 10 - 0.2) > 0.1


def test_bad_step_is_skipped_and_counted(small_corpus_file, tmp_path, monkeypatch):
    """A NaN loss skips the optimizer step, is logged with the data position, and the run
    continues."""
    import rltok.train as tr

    real = tr.training_loss
    calls = {"n": 0}

    def poisoned(model, batch, cfg, **kw):
        out = real(model, batch, cfg, **kw)
        calls["n"] += 1
        if calls["n"] == 3:
            out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(tr, "training_loss", poisoned)
    res = train(_cfg(small_corpus_file), tmp_path / "r", progress=False)
    assert res.summary["bad_steps"] == 1
    events = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    bad = [e for e in events if e.get("event") == "nonfinite"]
    assert len(bad) == 1 and bad[0]["step"] == 2 and "data_index" in bad[0]
    w = load_weights(tmp_path / "r" / "model.safetensors")
    assert all(torch.isfinite(v).all() for v in w.values())


@pytest.mark.parametrize("sink", ["tensorboard", "wandb"])
def test_metrics_also_go_to_tensorboard_and_wandb(sink, tmp_path, small_corpus_file, monkeypatch, one_thread):
    """train.log_to: the numbers of metrics.jsonl reach TensorBoard's event files (read back
    with tensorboard's own reader) and an offline W&B run."""
    pytest.importorskip(sink)
    from rltok.config import build_config
    from rltok.train import train

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = build_config("rl", "smoke", overrides={"data.source": str(small_corpus_file), "train.max_steps": 4,
                                                 "train.log_every": 2, "train.eval_docs": 2,
                                                 "train.log_to": sink})
    train(cfg, tmp_path / "run", progress=False)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    logged = {r["step"]: r["bpb"] for r in lines if "event" not in r}
    if sink == "tensorboard":
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
        acc.Reload()
        got = {e.step: e.value for e in acc.Scalars("train/bpb")}
        assert got.keys() == logged.keys()
        assert all(abs(got[s] - logged[s]) < 1e-3 for s in got)
        assert "final_eval/val_bpb" in acc.Tags()["scalars"]
    else:
        import wandb

        # run.finish() waits for the exit record, but wandb-core's writer may still hold the
        # record file's tail in a buffer (CI once read only its 7-byte header under load);
        # teardown stops the service, which closes the file, as process exit does for the CLI
        wandb.teardown()
        runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
        assert len(runs) == 1
        # the offline run's record file holds each history item as its key and JSON value
        data = next(runs[0].glob("*.wandb")).read_bytes()
        assert b"train/bpb" in data and b"final_eval/val_bpb" in data
        assert all(json.dumps(v).encode() in data for v in logged.values())


def test_log_to_rejects_unknown_sinks():
    from rltok.config import build_config
    from rltok.errors import RltokError

    with pytest.raises(RltokError, match="train.log_to='tensorbord'"):
        build_config("rl", "smoke", overrides={"train.log_to": "tensorbord"})
