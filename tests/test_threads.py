"""The default thread count: available cores (affinity, cgroup quota) less the busy ones."""

import pytest

from rltok import threads as th


@pytest.fixture
def fake(tmp_path, monkeypatch):
    def setup(cpu_max=None, running=1, affinity=4):
        v2 = tmp_path / "cpu.max"
        if cpu_max is not None:
            v2.write_text(cpu_max + "\n")
        monkeypatch.setattr(th, "CGROUP_V2", str(v2))
        monkeypatch.setattr(th, "CGROUP_V1", str(tmp_path / "nope"))
        la = tmp_path / "loadavg"
        la.write_text(f"0.50 0.40 0.30 {running}/200 12345\n")
        monkeypatch.setattr(th, "LOADAVG", str(la))
        monkeypatch.setattr(th.os, "sched_getaffinity", lambda pid: set(range(affinity)))
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    return setup


def test_idle_machine_uses_every_available_core(fake):
    fake(running=1, affinity=4)
    c = th.choose_threads()
    assert (c.threads, c.available, c.busy) == (4, 4, 0)
    assert "4 cores available, 0 busy" in c.describe()


def test_busy_cores_are_left_alone_but_one_thread_remains(fake):
    fake(running=3, affinity=4)  # two other runnable threads
    assert th.choose_threads().threads == 2
    fake(running=9, affinity=2)
    assert th.choose_threads().threads == 1


def test_cgroup_quota_caps_the_affinity(fake):
    fake(cpu_max="150000 100000", affinity=8)  # 1.5 CPUs
    assert th.available_cores() == 1
    fake(cpu_max="max 100000", affinity=8)
    assert th.available_cores() == 8


def test_explicit_choices_win(fake, monkeypatch):
    fake(running=5, affinity=4)
    assert th.choose_threads(3).threads == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    c = th.choose_threads()
    assert c.threads == 2 and "OMP_NUM_THREADS" in c.describe()
