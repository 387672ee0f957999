"""The Python examples (examples/python/*.py), each launched as torchrun
launches it in the README: 4 ranks (the training loop: 2; DDP and FSDP2
training: 2 and 4), on CPU. Every example checks its own results and exits
non-zero on a mismatch; the quick start's output lines and the training
examples' loss per step are checked here too.

The launches run a few at a time (they mostly wait on interpreter start-up),
once per session, in a module fixture.

Run: .venv/bin/python -m pytest -q tests/py/test_examples_py.py
"""

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchcomms._comms")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "python"
TORCHRUN = Path(sys.executable).with_name("torchrun")
LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
              "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
              "TORCHELASTIC_RUN_ID", "TORCHCOMM_RANK", "TORCHCOMM_SIZE")
# (script, ranks)
ALL_RUNS = [
    ("AllReduceSync.py", 4), ("AllReduceAsync.py", 4), ("SendRecvSync.py", 4),
    ("SendRecvAsync.py", 4), ("AllGather.py", 4), ("Broadcast.py", 4),
    ("ObjectCollectives.py", 4), ("BatchSendRecv.py", 4), ("TrainingLoop.py", 2),
    ("train_ddp.py", 2), ("train_ddp.py", 4), ("train_fsdp.py", 2), ("train_fsdp.py", 4),
    ("window_put_signal.py", 3), ("window_put_signal.py", 4), ("compiled_tp.py", 2),
]
# The TCP pass of make test (TORCHCOMMS_CPU_TRANSPORT=tcp) launches one
# example of each kind: the collectives, point-to-point, batches, DDP / FSDP2
# training and windows under them are the same calls over either transport,
# and tests/py/test_collectives_py.py, test_torch_integration.py and
# test_windows_py.py run them on TCP in full. torch.compile's tracing does
# not depend on the transport at all (tests/py/compat/conftest.py). The 16
# launches import torch in some 70 processes: about 150 s on 2 cores.
TCP_RUNS = [("AllReduceAsync.py", 4), ("BatchSendRecv.py", 4), ("train_fsdp.py", 4),
            ("window_put_signal.py", 4)]
TCP_PASS = os.environ.get("TORCHCOMMS_CPU_TRANSPORT") == "tcp"
RUNS = TCP_RUNS if TCP_PASS else ALL_RUNS
# ours, over torch.distributed (DDP, FSDP2): not upstream's seed examples
TORCH_TRAINING = {"train_ddp.py", "train_fsdp.py"}
# ours too: torch.compile over torchcomms.functional; a halo exchange with
# one-sided windows (checks itself against a one-process reference)
OURS = TORCH_TRAINING | {"compiled_tp.py", "window_put_signal.py"}
# ours, with a test of their own (not launched by torchrun)
TESTED_ELSEWHERE = {"fault_tolerant_training.py": "tests/py/test_fault_tolerant_training.py"}
OURS |= set(TESTED_ELSEWHERE)
PARALLEL = 3
TIMEOUT = 180


def clean_env():
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    env["OMP_NUM_THREADS"] = "1"
    return env


@pytest.fixture(scope="module")
def finished():
    """Runs every launch of RUNS, PARALLEL at a time: {(script, n): (rc, out, err)}."""
    pending = list(RUNS)
    running, done = {}, {}
    while pending or running:
        while pending and len(running) < PARALLEL:
            script, n = pending.pop(0)
            # files, not pipes: nobody reads while the launches run
            out_f, err_f = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            p = subprocess.Popen([str(TORCHRUN), "--standalone", f"--nproc_per_node={n}",
                                  str(EXAMPLES / script)], stdout=out_f, stderr=err_f,
                                 text=True, env=clean_env(), cwd=str(ROOT),
                                 start_new_session=True)
            running[(script, n)] = (p, time.monotonic(), out_f, err_f)
        for key, (p, t0, out_f, err_f) in list(running.items()):
            if p.poll() is not None or time.monotonic() - t0 > TIMEOUT:
                timed_out = p.poll() is None
                if timed_out:  # the launcher and its ranks
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                out_f.seek(0)
                err_f.seek(0)
                out, err = out_f.read(), err_f.read()
                out_f.close()
                err_f.close()
                done[key] = (None if timed_out else p.returncode, out,
                             err + (f"\n*** TIMEOUT after {TIMEOUT} s" if timed_out else ""))
                del running[key]
        time.sleep(0.05)
    return done


def _ok(result):
    rc, out, err = result
    assert rc == 0, f"exit {rc}\n--- stdout\n{out[-4000:]}\n--- stderr\n{err[-6000:]}"
    return out


@pytest.mark.parametrize("script,n", RUNS, ids=[f"{s[:-3]}-{n}" for s, n in RUNS])
def test_example(finished, script, n):
    out = _ok(finished[(script, n)])
    if script == "TrainingLoop.py":
        assert f"parameters identical on all {n} ranks" in out, out
        assert "step   0  loss" in out
    elif script in TORCH_TRAINING:
        # rank 0 prints the loss of every step, then the verdict
        steps = re.findall(r"^step +(\d+) +loss ([0-9.]+)", out, re.M)
        assert [int(s) for s, _ in steps] == list(range(20)), out
        assert float(steps[-1][1]) < float(steps[0][1]), out
        verdict = (f"parameters identical on all {n} ranks" if script == "train_ddp.py"
                   else f"matches the unsharded reference on {n} ranks")
        assert verdict in out, out
    elif script == "compiled_tp.py":
        assert f"matches the unsharded reference on {n} ranks" in out, out
    elif script == "window_put_signal.py":
        assert ("window_put_signal: heat equation, 240 cells, 200 steps: the halo exchange "
                f"matches the reference on {n} ranks") in out, out
    elif script != "AllReduceSync.py":
        for r in range(n):
            assert f"Rank {r}:" in out, out


@pytest.mark.parametrize("n", [4])
def test_quick_start_output(finished, n):
    if ("AllReduceSync.py", n) not in RUNS:
        pytest.skip("the TCP pass does not launch the quick start (TCP_RUNS)")
    out = _ok(finished[("AllReduceSync.py", n)])
    total = float(n * (n + 1) // 2)

    def has(line):
        # the ranks share stdout: a line may be split by another rank's
        # output (print writes the text and the newline separately when
        # unbuffered), so look for the exact text, not whole lines
        return re.search(re.escape(line) + r"(?![0-9.])", out) is not None

    for r in range(n):
        assert has(f"Rank {r}: Before AllReduce: {float(r + 1)}"), out
        assert has(f"Rank {r}: After AllReduce: {total}"), out
    assert not re.search(r"After AllReduce: (?!%s)" % re.escape(str(total)), out), out
    if n == 4:
        assert has("Rank 0: After AllReduce: 10.0")


def test_every_example_is_tested():
    assert set(TCP_RUNS) <= set(ALL_RUNS), set(TCP_RUNS) - set(ALL_RUNS)
    scripts = {p.name for p in EXAMPLES.glob("*.py")}
    tested = {s for s, _ in ALL_RUNS} | set(TESTED_ELSEWHERE)
    assert all((ROOT / t).is_file() for t in TESTED_ELSEWHERE.values()), TESTED_ELSEWHERE
    assert scripts == tested, scripts ^ tested


def test_examples_only_change_backend_and_device():
    """The examples are upstream's with the backend and device changed: they
    create their communicator as new_comm("cpu", device, name="main_comm").
    (Not our own: the DDP / FSDP2 training examples, over torch.distributed,
    and the compiled tensor-parallel MLP.)"""
    for p in EXAMPLES.glob("*.py"):
        if p.name in OURS:
            continue
        src = p.read_text()
        assert 'new_comm("cpu", device, name="main_comm")' in src, p.name
        assert 'torch.device("cpu")' in src, p.name
        assert "torch.distributed" not in src, p.name
