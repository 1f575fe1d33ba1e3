"""The mutation script's quick form: every deliberate bug in the estimator, the policy's loss and
the objectives makes the estimator/method tests fail (docs/testing.md). Slow: ~5 minutes."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_every_mutation_is_caught():
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "mutation_test.py"), "--quick"],
                          capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SURVIVED" not in proc.stdout


def test_mutations_apply_to_the_current_code(tmp_path):
    """Each mutation's text is still in its file exactly once (cheap; keeps the script runnable)."""
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import mutation_test as mt
    finally:
        sys.path.pop(0)
    for m in mt.MUTATIONS:
        assert (REPO / m.path).read_text().count(m.old) == 1, m.name
