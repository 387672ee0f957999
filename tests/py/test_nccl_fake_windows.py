"""One-sided windows on the nccl backend without a GPU, through the fake NCCL
and CUDA runtime of tests/c/fake_nccl/ (fake_nccl_win.c: ncclMemAlloc,
symmetric windows and ncclPutSignal / ncclWaitSignal on host memory shared
between the ranks' processes).

What this covers, with tests/c/helpers/nccl_window.c (build/tc_nccl_window)
under tcrun: the backend's real code path for NCCL >= 2.29 at 2, 3 and 4
ranks (a 3 MiB put staged in chunks, small puts at odd offsets, a put from
inside the window, several signals before a wait, an asynchronous
wait_signal, a rank's own window, every byte checked); map and access with
and without peer pointers (ncclGetPeerDevicePointer); get and flush refused
clearly; NCCL 2.27 (windows and map, put/signal/wait_signal refused naming
the version) and NCCL 2.21 (creation refused naming the version). What ncclGetVersion
reports is set with TCFAKE_NCCL_VERSION.

What it cannot cover: real device memory, NCCL's own kernels and proxy,
ordering over a network: tests/gpu/run.sh on a GPU.

Run: .venv/bin/python -m pytest -q tests/py/test_nccl_fake_windows.py
"""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("TC_BUILD_DIR", ROOT / "build"))
FAKE = BUILD / "fake_nccl"
PROG = BUILD / "tc_nccl_window"
LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
              "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
              "TORCHELASTIC_RUN_ID", "TORCHCOMM_RANK", "TORCHCOMM_SIZE",
              "TORCHCOMMS_NCCL_FAKE_HOST", "TORCHCOMMS_BACKEND_LIB_PATH_NCCL",
              "TCFAKE_NCCL_VERSION", "TCFAKE_NCCL_PEER_PTR", "TCFAKE_NCCL_FAULT")

pytestmark = pytest.mark.skipif(
    not (FAKE / "libtcfake_nccl.so").exists() or not PROG.exists(),
    reason=f"the fake NCCL or {PROG.name} is not built (run make build)")


def run(mode, n, version, **extra):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    env.update(OMP_NUM_THREADS="1", TCFAKE_NCCL_TIMEOUT="60",
               TCFAKE_NCCL_VERSION=str(version),
               TORCHCOMMS_NCCL_LIB=str(FAKE / "libtcfake_nccl.so"),
               TORCHCOMMS_CUDART_LIB=str(FAKE / "libtcfake_cudart.so"), **extra)
    p = subprocess.run([str(BUILD / "tcrun"), "-n", str(n), str(PROG), mode], env=env,
                       capture_output=True, text=True, timeout=180, cwd=str(ROOT))
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    for r in range(n):
        assert f"nccl_window rank {r}: " in p.stdout, out
    assert "FAILED" not in out, out
    return p.stdout


@pytest.mark.parametrize("n", [2, 3, 4])
def test_put_signal_wait_signal_exact(n):
    out = run("rma", n, 22900)
    for r in range(n):
        assert f"nccl_window rank {r}: 10 checks passed" in out, out
    assert ("REFUSED get: torchcomms: get on 'nccl_window' (rank 0 of %d): NCCL has no "
            "one-sided get" % n) in out, out
    assert "REFUSED flush: torchcomms: flush on 'nccl_window' (rank 0 of %d): NCCL has no " \
           "flush of one-sided puts: signal the peer after the puts" % n in out, out


def test_without_peer_pointers_the_window_is_separate():
    """Where ncclGetPeerDevicePointer gives no pointer (peers outside the
    NVLink domain), map is refused and access says SEPARATE; put, signal and
    wait_signal still work."""
    out = run("rma", 2, 22900, TCFAKE_NCCL_PEER_PTR="0")
    assert "nccl_window rank 0: 9 checks passed" in out, out


def test_nccl_2_27_maps_windows_and_refuses_put_naming_the_version():
    out = run("noput", 2, 22703)
    for op in ("put", "signal", "wait_signal"):
        assert (f"REFUSED {op}: torchcomms: {op} on 'nccl_window' (rank 0 of 2): {op} needs "
                "NCCL >= 2.29 (ncclPutSignal and ncclWaitSignal, host-initiated one-sided "
                "operations); this process loaded NCCL 2.27.3 from ") in out, out
    assert "nccl_window rank 1: 4 checks passed" in out, out


def test_nccl_older_than_2_27_refuses_windows_naming_the_version():
    out = run("refuse", 2, 22105)
    assert ("windows need NCCL >= 2.27 (ncclCommWindowRegister); this process loaded NCCL "
            "2.21.5 from ") in out, out
    assert "install a newer NCCL" in out, out
