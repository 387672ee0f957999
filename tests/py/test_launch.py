"""The C examples launched as real processes by tcrun and by torchrun
(--no-python): under torchrun every rank is a client of torch's own agent
TCPStore, so this also proves our store client against torch's server."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BUILD = Path(os.environ.get("TC_BUILD_DIR", Path(__file__).resolve().parents[2] / "build"))
EXAMPLES = BUILD / "examples"
TORCHRUN = Path(sys.executable).with_name("torchrun")
ALL_EXAMPLES = ["all_reduce_sync", "all_reduce_async", "send_recv_ring", "all_gather",
                "broadcast", "batch_send_recv", "split", "window_pipeline"]


def run(cmd, timeout=120):
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"):
        env.pop(k, None)
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                          timeout=timeout, env=env)


def check_quickstart(out, n):
    for r in range(n):
        assert f"Rank {r}: Before AllReduce: {r + 1}.0" in out
        assert f"Rank {r}: After AllReduce: {n * (n + 1) // 2}.0" in out


@pytest.mark.parametrize("n", [1, 2, 4])
def test_quickstart_tcrun(n):
    p = run([BUILD / "tcrun", "-n", n, EXAMPLES / "all_reduce_sync"])
    assert p.returncode == 0, p.stderr
    check_quickstart(p.stdout, n)


@pytest.mark.parametrize("n", [2, 4])
def test_quickstart_torchrun(n):
    p = run([TORCHRUN, "--standalone", "--no-python", f"--nproc_per_node={n}",
             EXAMPLES / "all_reduce_sync"])
    assert p.returncode == 0, p.stdout + p.stderr
    check_quickstart(p.stdout, n)


@pytest.mark.parametrize("name", ALL_EXAMPLES)
def test_examples_tcrun(name):
    p = run([BUILD / "tcrun", "-n", 4, "--tag-output", EXAMPLES / name])
    assert p.returncode == 0, p.stdout + p.stderr
    for r in range(4):
        assert re.search(rf"^\[{r}\]: Rank {r}", p.stdout, re.M), p.stdout


@pytest.mark.parametrize("name", ["send_recv_ring", "batch_send_recv", "split"])
def test_examples_torchrun(name):
    p = run([TORCHRUN, "--standalone", "--no-python", "--nproc_per_node=4",
             EXAMPLES / name])
    assert p.returncode == 0, p.stdout + p.stderr


def test_tcrun_failing_rank_is_named():
    # rank 1 exits with 3 before joining; the others block in comm creation
    # and must be stopped by tcrun after the grace period.
    script = 'if [ "$RANK" = 1 ]; then exit 3; fi; exec "$0"'
    p = run([BUILD / "tcrun", "-n", 3, "--grace", "1", "sh", "-c", script,
             EXAMPLES / "all_reduce_sync"], timeout=60)
    assert p.returncode == 3
    assert "rank 1" in p.stderr


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_rank0_hosts_the_store():
    """Without an agent store, rank 0 hosts a TCPStore on MASTER_PORT and
    every rank finds its rank and size in TORCHCOMM_RANK / TORCHCOMM_SIZE."""
    n, port = 3, free_port()
    procs = []
    for r in range(n):
        env = dict(os.environ, TORCHCOMM_RANK=str(r), TORCHCOMM_SIZE=str(n),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        procs.append(subprocess.Popen([str(EXAMPLES / "all_reduce_sync")], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    out = ""
    for p in procs:
        o, e = p.communicate(timeout=60)
        assert p.returncode == 0, e
        out += o
    check_quickstart(out, n)


def test_install_and_pkg_config(tmp_path):
    """make install's layout: a versioned soname, the headers, a pkg-config
    file that compiles and links a program against the installed library."""
    prefix = tmp_path / "prefix"
    p = subprocess.run(["cmake", "--install", str(BUILD), "--prefix", str(prefix)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    libdir = next(prefix.glob("lib*/libtorchcomms.so.0")).parent
    assert (prefix / "include" / "torchcomms.h").exists()
    assert (prefix / "include" / "torchcomms_backend.h").exists()
    assert (prefix / "bin" / "tcrun").exists()
    assert list(libdir.glob("cmake/torchcomms/torchcommsTargets*.cmake"))
    soname = subprocess.run(["readelf", "-d", str(libdir / "libtorchcomms.so")],
                            capture_output=True, text=True).stdout
    assert "Library soname: [libtorchcomms.so.0]" in soname
    env = dict(os.environ, PKG_CONFIG_PATH=str(libdir / "pkgconfig"))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "torchcomms"],
                           capture_output=True, text=True, env=env)
    assert flags.returncode == 0, flags.stderr
    exe = tmp_path / "quickstart"
    src = Path(__file__).resolve().parents[2] / "examples" / "all_reduce_sync.c"
    cc = subprocess.run(["cc", str(src), "-o", str(exe)] + flags.stdout.split(),
                        capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    run_env = dict(os.environ, LD_LIBRARY_PATH=str(libdir), TORCHCOMM_RANK="0",
                   TORCHCOMM_SIZE="1")
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        run_env.pop(k, None)
    r = subprocess.run([str(exe)], capture_output=True, text=True, env=run_env, timeout=30)
    assert r.returncode == 0, r.stderr
    assert "Rank 0: After AllReduce: 1.0" in r.stdout


def test_torchrun_restarts_start_promptly():
    """torchrun --max-restarts=2, attempts 0 and 1 die after creating
    communicators: attempt 2 must create its communicators at once and
    succeed (the keys are scoped by the restart count and deleted after
    creation), not read attempt 0's token and addresses and wait out the
    timeout."""
    worker = Path(__file__).resolve().parent / "workers" / "restart_worker.py"
    env_timeout = {"TORCHCOMM_TIMEOUT_SECONDS": "30"}
    os.environ.update(env_timeout)
    try:
        p = run([TORCHRUN, "--standalone", "--nproc_per_node=3", "--max-restarts=2",
                 "--monitor-interval=0.1", worker], timeout=240)
    finally:
        for k in env_timeout:
            os.environ.pop(k, None)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    for attempt in range(3):
        for r in range(3):
            assert f"attempt {attempt} rank {r}: created in" in p.stdout, out
    for r in range(3):
        assert f"attempt 2 rank {r}: done" in p.stdout, out
    for m in re.finditer(r"created in ([0-9.]+) s", p.stdout):
        assert float(m.group(1)) < 10, out


@pytest.mark.parametrize("case", [0, 1])
@pytest.mark.parametrize("n", [2, 3])
def test_mismatched_collectives_raise_on_every_rank(case, n):
    worker = Path(__file__).resolve().parent / "workers" / "mismatch_worker.py"
    p = run([TORCHRUN, "--standalone", f"--nproc_per_node={n}", worker, case], timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    for r in range(n):
        assert f"rank {r}: OK" in p.stdout, out
