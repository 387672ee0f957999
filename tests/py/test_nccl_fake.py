"""The nccl backend from Python without a GPU, through the fake NCCL and CUDA
runtime of tests/c/fake_nccl/ (built by CMake into build/fake_nccl/).

What this covers: torchcomms.new_comm("nccl", ...) loads the backend module
shipped beside the extension (torchcomms/libtorchcomms-nccl.so), which loads
the libraries named by TORCHCOMMS_NCCL_LIB / TORCHCOMMS_CUDART_LIB,
bootstraps through torchrun's store, and runs every operation with 2 ranks
under torchrun (tests/py/workers/nccl_worker.py), checked exactly; the
missing-library message; a communicator on a CUDA device asking torch for
its current stream and refusing CPU tensors; the C example
examples/nccl_all_reduce under tcrun, and its clean skip without NCCL.

What it cannot cover: the fake's "device pointers" are host pointers, so the
2-rank run uses CPU tensors with the test-only switch
TORCHCOMMS_NCCL_FAKE_HOST=1 (the backend accepts device "cpu"); real CUDA
tensors, real streams and real NCCL kernels need a GPU: tests/gpu/run.sh.

Run: .venv/bin/python -m pytest -q tests/py/test_nccl_fake.py
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
_comms = pytest.importorskip("torchcomms._comms")

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("TC_BUILD_DIR", ROOT / "build"))
FAKE = BUILD / "fake_nccl"
TORCHRUN = Path(sys.executable).with_name("torchrun")
WORKER = ROOT / "tests" / "py" / "workers" / "nccl_worker.py"
LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
              "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
              "TORCHELASTIC_RUN_ID", "TORCHCOMM_RANK", "TORCHCOMM_SIZE",
              "TORCHCOMMS_NCCL_FAKE_HOST", "TORCHCOMMS_BACKEND_LIB_PATH_NCCL")

pytestmark = pytest.mark.skipif(
    not (FAKE / "libtcfake_nccl.so").exists(),
    reason=f"the fake NCCL is not built ({FAKE}; run make build)")


def fake_env(host=True):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    env.update(OMP_NUM_THREADS="1", TCFAKE_NCCL_TIMEOUT="60",
               TORCHCOMMS_NCCL_LIB=str(FAKE / "libtcfake_nccl.so"),
               TORCHCOMMS_CUDART_LIB=str(FAKE / "libtcfake_cudart.so"))
    if host:
        env["TORCHCOMMS_NCCL_FAKE_HOST"] = "1"  # test only: host tensors
    return env


def run_python(code, env, timeout=120):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=timeout,
                          cwd=str(ROOT))


def test_module_is_shipped_beside_the_extension():
    so = Path(_comms.__file__).parent / "libtorchcomms-nccl.so"
    assert so.exists(), f"{so} is missing: setup.py builds it with the extension"


def test_every_operation_two_ranks_under_torchrun():
    p = subprocess.run([str(TORCHRUN), "--standalone", "--nproc_per_node=2",
                        str(WORKER), "cpu"], env=fake_env(), capture_output=True,
                       text=True, timeout=240, cwd=str(ROOT))
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    for r in range(2):
        assert f"nccl worker rank {r} of 2:" in p.stdout, out
        assert "checks passed" in p.stdout, out


def test_missing_nccl_says_what_it_tried():
    env = fake_env()
    env["TORCHCOMMS_NCCL_LIB"] = "/nonexistent/libnccl.so.2"
    p = run_python("""
        import torch, torchcomms
        try:
            torchcomms.new_comm("nccl", torch.device("cuda", 0))
        except RuntimeError as e:
            print("ERROR:", e)
        """, env)
    assert p.returncode == 0, p.stderr
    assert ("cannot load the NCCL library: tried /nonexistent/libnccl.so.2 from "
            "$TORCHCOMMS_NCCL_LIB") in p.stdout, p.stdout + p.stderr


def test_cuda_device_and_the_test_switch():
    """On device cuda:0 (the fake runtime has 8 devices) CPU tensors are
    refused and every operation asks torch for the current CUDA stream (a
    CPU-only torch raises there); device cpu needs the test-only switch."""
    p = run_python("""
        import torch, torchcomms
        comm = torchcomms.new_comm("nccl", torch.device("cuda", 0), name="on_cuda")
        print("DEVICE", comm.get_device(), comm.get_backend())
        try:
            comm.all_reduce(torch.ones(2))
        except ValueError as e:
            print("REFUSED:", e)
        try:
            comm.barrier()
            print("BARRIER ok")
        except Exception as e:
            print("STREAM:", type(e).__name__, e)
        comm.finalize()
        try:
            torchcomms.new_comm("nccl", torch.device("cpu"), name="on_cpu")
        except ValueError as e:
            print("CPU:", e)
        """, fake_env(host=False))
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "DEVICE cuda:0 nccl" in p.stdout, out
    assert "REFUSED: all_reduce: argument 'tensor' is on device 'cpu'" in p.stdout, out
    import torch
    if torch.cuda.is_available():
        assert "BARRIER ok" in p.stdout, out
    else:
        assert "STREAM:" in p.stdout and "CUDA" in p.stdout, out
    assert "CPU: " in p.stdout and "runs on CUDA devices" in p.stdout, out


def test_c_example_runs_on_the_fake_and_skips_without_nccl():
    """examples/nccl_all_reduce.c: device buffers, its own stream, sync and
    async; 2 ranks under tcrun on the fake; exit 0 with "skipping" where
    there is no NCCL."""
    exe = BUILD / "examples" / "nccl_all_reduce"
    env = fake_env(host=False)
    p = subprocess.run([str(BUILD / "tcrun"), "-n", "2", str(exe)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    for r in range(2):
        assert f"Rank {r}: After AllReduce: 3.0" in p.stdout, p.stdout
    env["TORCHCOMMS_NCCL_LIB"] = "/nonexistent/libnccl.so.2"
    p = subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "nccl_all_reduce: skipping:" in p.stdout, p.stdout
    assert "cannot load the NCCL library" in p.stdout, p.stdout


def test_reconfigure_is_refused_clearly():
    """The nccl backend cannot reconfigure (issue 14): new_comm with
    enable_reconfigure=True, get_init_handle and reconfigure raise
    RuntimeError in torchcomms' words ("reconfigure not implemented")."""
    p = run_python("""
        import torch, torchcomms
        try:
            torchcomms.new_comm("nccl", torch.device("cuda", 0), name="ft",
                                enable_reconfigure=True)
        except RuntimeError as e:
            print("CREATE:", e)
        comm = torchcomms.new_comm("nccl", torch.device("cuda", 0), name="plain")
        print("ABORT_SUPPORTED", comm.is_abort_supported())
        for f in (comm.get_init_handle, lambda: comm.reconfigure(0, ["test_handle"])):
            try:
                f()
            except RuntimeError as e:
                print("REFUSED:", e)
        comm.finalize()
        """, fake_env(host=False))
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert ("CREATE: torchcomms: tc_comm_create: backend 'nccl' does not support "
            "enable_reconfigure=True (reconfigure not implemented)") in p.stdout, out
    assert "ABORT_SUPPORTED True" in p.stdout, out
    assert ("REFUSED: torchcomms: get_init_handle on 'plain' (rank 0 of 1): getInitHandle "
            "not implemented for communicator:plain (backend 'nccl' cannot reconfigure)"
            ) in p.stdout, out
    assert ("REFUSED: torchcomms: reconfigure on 'plain' (rank 0 of 1): reconfigure not "
            "implemented for communicator:plain (backend 'nccl' cannot reconfigure; backend "
            "'cpu' can)") in p.stdout, out


def test_python_windows_are_refused_clearly_on_nccl():
    """Windows from Python live on host memory the library allocates (the cpu
    backend). On the nccl backend tensor_register raises RuntimeError saying
    so, whether the communicator is on a cuda device (refused before any
    pointer is read) or, with the fake's host switch, on the cpu device
    (the backend's own window memory cannot be re-homed onto)."""
    code = """
        import torch, torchcomms
        dev = torch.device(%r)
        comm = torchcomms.new_comm("nccl", dev, name="w")
        win = comm.new_window()
        try:
            win.tensor_register(torch.zeros(4))
        except RuntimeError as e:
            print("REFUSED:", e)
        comm.finalize()
        """
    cases = [
        ("cuda:0", False, "REFUSED: TorchCommWindow.tensor_register on 'w' (rank 0 of 1): "
         "windows from Python need a communicator on the cpu device; this one is on "
         "'cuda' (backend 'nccl')."),
        ("cpu", True, "REFUSED: torchcomms: tensor_register on 'w': backend 'nccl' keeps its "
         "window memory itself, and windows from Python need host memory the library "
         "allocates (the cpu backend)"),
    ]
    for device, host, want in cases:
        p = run_python(code % device, fake_env(host=host))
        out = p.stdout + p.stderr
        assert p.returncode == 0, out
        assert want in p.stdout, out
