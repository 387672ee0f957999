"""The short soak (tests/soak/soak.py): 20,000 mixed small operations per rank
on 2 ranks from Python; private RSS must grow by less than 2 MiB after the
warm-up, and the open descriptors and threads must not change. `make soak`
runs the long one (10^6 operations per rank).

Run: make pyinstall && TC_BUILD_DIR=build .venv/bin/python -m pytest -q tests/py/test_soak.py
"""
import os
import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parents[1] / "soak" / "soak.py"


def test_soak_short():
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    p = subprocess.run([sys.executable, str(SOAK), "--ops", "20000", "--timeout", "240"],
                       capture_output=True, text=True, timeout=300, env=env)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("soak rank ")]
    assert len(lines) == 2, out
    for ln in lines:
        assert "20000 ops" in ln, ln
