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
                "broadcast", "batch_send_recv", "split"]


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
