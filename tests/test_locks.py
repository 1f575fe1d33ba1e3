"""Cross-process locks on shared caches (rltok.locks): a held lock is seen by another process, and
two processes that need the same cached BPE at once fit it once, and a compare waits for the
reference BPE another compare is fitting in the same DIR."""

import os
import subprocess
import sys
import time

from rltok.locks import held

HOLD = """
import sys, time
from rltok.locks import held
with held(sys.argv[1]):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_lock_held_by_another_process_is_seen_and_freed_when_it_dies(tmp_path):
    lock = tmp_path / "sub" / "x.lock"
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        with held(lock, wait=False) as mine:
            assert mine is False
    finally:
        p.kill()  # SIGKILL: the kernel releases the flock, no stale lock is left
        p.wait()
    with held(lock, wait=False) as mine:
        assert mine is True
        with held(lock, wait=False) as again:  # a second holder in the same process is refused too
            assert again is False


FIT = """
import sys
from rltok.analysis import run_bpe
from rltok.config import build_config
cfg = build_config("bpe", "smoke", overrides={"data.source": sys.argv[1]})
tok, label = run_bpe(cfg, progress=True)
print(label, flush=True)
"""


def test_processes_that_need_the_same_bpe_at_once_fit_it_once(tmp_path, small_corpus_file):
    env = dict(os.environ, RLTOK_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", FIT, str(small_corpus_file)], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    fits = sum(o[1].count("fitting a BPE") for o in outs)
    assert fits == 1, [o[1] for o in outs]
    labels = {o[0].strip() for o in outs}
    assert len(labels) == 1 and labels.pop().startswith("bpe")
    assert len(list((tmp_path / "cache" / "bpe").glob("*.json"))) == 2  # the tokenizer and its info


COMPARE_FIT = """
import sys
from pathlib import Path
from rltok.compare import CompareSpec, Variant, _reference_bpe, build_variant_config
from rltok.data import load_splits
spec = CompareSpec(variants=[Variant(method="uniform", text="uniform")], out=Path(sys.argv[2]),
                   preset="smoke", data=sys.argv[1])
base = build_variant_config(spec, spec.variants[0], 1, None)
train = load_splits(base).train
print("ready", flush=True)
path = _reference_bpe(spec, base, train, lambda m: print(m, file=sys.stderr, flush=True))
print(path.read_text(), flush=True)
"""


def test_a_compare_waits_for_the_reference_bpe_another_is_fitting_in_its_dir(tmp_path, small_corpus_file):
    # this process plays the compare that is fitting: it holds DIR's lock, and writes the file
    # only after the other has reached the fit; that one must wait and read it, not fit its own
    env = dict(os.environ, RLTOK_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    out = tmp_path / "cmp"
    ref = out / "bpe_reference.json"
    with held(out / "bpe_reference.json.lock"):
        p = subprocess.Popen([sys.executable, "-c", COMPARE_FIT, str(small_corpus_file), str(out)], env=env,
                             text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert p.stdout.readline().strip() == "ready"
        time.sleep(2)
        ref.write_text("written by the first compare")
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 0, stderr[-2000:]
    assert "fitting the reference BPE" not in stderr, stderr
    assert stdout.strip() == "written by the first compare"


def test_fetch_once_builds_once_and_names_an_unwritable_cache(tmp_path):
    import pytest

    from rltok.data.debs import fetch_once
    from rltok.errors import RltokError

    built = []

    def build(d):
        built.append(d.name)
        (d / "done").write_text("x")

    dest = tmp_path / "cache" / "thing-v1"
    ready = lambda d: (d / "done").is_file()  # noqa: E731
    for _ in range(2):
        assert fetch_once(dest, ready, build, "the thing") == dest
    assert built == ["thing-v1.tmp"] and ready(dest) and not (tmp_path / "cache" / "thing-v1.tmp").exists()

    def broken(d):
        (d / "half").write_text("x")
        raise RuntimeError("network down")

    with pytest.raises(RuntimeError):
        fetch_once(tmp_path / "cache" / "other", ready, broken, "the other")
    assert not (tmp_path / "cache" / "other").exists()  # a failed build leaves no half cache behind

    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(RltokError, match="the thing: cannot write its cache"):
        fetch_once(tmp_path / "file" / "thing-v1", ready, build, "the thing")
