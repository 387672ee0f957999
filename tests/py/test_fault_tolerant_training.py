"""examples/python/fault_tolerant_training.py, once, at 3 ranks, on the
transport of this pass of make test (shared memory; TCP in the TCP pass):
one worker is SIGKILLed in the middle of a step's all_reduce, the survivors
reconfigure and go on, a replacement joins. Asserted: every worker but the
victim exits 0; the final parameters of the survivors and of the
replacement are bitwise equal (torch.equal) to the launcher's failure-free
single-process run over the same global batches (which moved away from the
initial parameters: the comparison is not vacuous); no worker process and
no shared-memory segment of the workers is left.

The chaos version (many runs, random kill points, 3 and 4 ranks, both
transports): make chaos-ft (tests/chaos/ft_chaos.py).

Run: .venv/bin/python -m pytest -q tests/py/test_fault_tolerant_training.py
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchcomms._comms")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "python" / "fault_tolerant_training.py"
TIMEOUT = 150


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_fault_tolerant_training():
    cmd = [sys.executable, str(EXAMPLE), "-n", "3", "--steps", "30", "--kill-worker", "1",
           "--kill-step", "12", "--kill-phase", "during_all_reduce", "--json"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         cwd=str(ROOT), start_new_session=True)
    try:
        out, _ = p.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        pytest.fail(f"no result after {TIMEOUT} s\n{out[-6000:]}")
    assert p.returncode == 0, out[-6000:]
    s = json.loads(next(line for line in out.splitlines() if line.startswith("{")))

    assert (s["killed"], s["kill_step"], s["kill_phase"]) == (1, 12, "during_all_reduce"), s
    assert s["replacement"] == 3 and s["finals"] == [0, 2, 3], s
    # the victim died in the 13th step (12 completed): the survivors had
    # completed 12 or 13 steps (the all_reduce may have got through), and
    # their first step in the new group was the 13th or the 14th
    assert s["resumed_step"] in (13, 14), s
    assert 0 < s["recovery_s"] < 30, s
    assert s["equal"] and s["max_diff"] == 0.0, s
    assert s["reference_moved"] > 1e-3, s
    assert s["shm_left"] == [], s
    assert not [pid for pid in s["pids"] if alive(pid)], s
    expected = os.environ.get("TORCHCOMMS_CPU_TRANSPORT", "auto")
    assert s["transport"] == expected, s
    assert "peer 1" in out, out  # the survivors' error names the dead worker
    assert "bitwise equal to the failure-free reference" in out, out


def test_leftover_check_can_fail():
    """The example's /dev/shm check finds a segment named as the transport
    names them (src/transport/shm_sweep.c) for one of the given pids."""
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        import fault_tolerant_training as ft
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    me = str(os.getpid())  # alive: no sweeper removes it meanwhile
    name = f"torchcomms-0badc0de-{'0' * 32}-0-effffffc-{me}-1"
    path = Path("/dev/shm") / name
    path.write_bytes(b"")
    try:
        assert ft.our_shm_segments({me}) == [name]
        assert ft.our_shm_segments({"1"}) == []
    finally:
        path.unlink()
