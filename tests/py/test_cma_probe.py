"""build/tccma_probe (bench/cma_copy_probe.c): the floor of a 2-rank
all_gather's copies (memcpy of the own block, process_vm_readv of the
peer's). Every mode prints "MODE BYTES best_us mean_us" with best <= mean,
the peer's bytes are checked (exit 1 when wrong), and a bad mode is
refused with exit status 2 before anything runs; a failure is said and
ends the probe, it is not waited on."""
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(os.environ.get("TC_BUILD_DIR", ROOT / "build")) / "tccma_probe"
pytestmark = pytest.mark.skipif(not PROBE.exists(), reason="tccma_probe is not built")


def test_cma_probe_modes():
    r = subprocess.run([str(PROBE), "65536", "5"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    if "SKIP" in r.stdout:
        pytest.skip(r.stdout.strip())
    rows = [l.split() for l in r.stdout.splitlines() if l and not l.startswith("#")]
    assert [row[0] for row in rows] == ["both", "copy", "read", "stream"], r.stdout
    for row in rows:
        assert len(row) == 4 and row[1] == "65536", row
        best, mean = float(row[2]), float(row[3])
        assert 0 < best <= mean, row


def test_cma_probe_bad_mode():
    r = subprocess.run([str(PROBE), "4096", "1", "both", "bogus"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2
    assert "unknown mode 'bogus'" in r.stderr
    assert r.stdout == ""


def test_cma_probe_failure_is_reported_not_waited_on():
    # 1 TiB buffers cannot be had: both processes fail before the first
    # barrier; the probe says so and exits 1 at once instead of waiting
    r = subprocess.run([str(PROBE), str(1 << 40), "1", "both"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1
    assert "tccma_probe: both: out of memory for its buffers" in r.stderr
