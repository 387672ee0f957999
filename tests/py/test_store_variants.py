"""new_comm(..., store=X) with every kind of store, and without one under
every launcher.

- torchrun (2 ranks, this file is the worker): no store (torch's agent
  store), a torch.distributed.TCPStore hosted by rank 0 (is_master), a
  PrefixStore over it, a FileStore on a shared file, a client of the
  agent's own TCPStore; all of these communicators (different names) alive
  at once in each process and used interleaved, two of them on one store.
- tcrun (2 ranks): no store (tcrun's TCPStore server).
- plain subprocesses with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT and
  no launcher: rank 0 hosts the store.
- world size 1, in this process: HashStore, and no store at all (in-process).

Run: TC_BUILD_DIR=build .venv/bin/python -m pytest -q tests/py/test_store_variants.py
"""

import json
import os
import signal
import socket
import subprocess
import sys
import traceback
from datetime import timedelta
from pathlib import Path

LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
              "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
              "TORCHELASTIC_RUN_ID", "TORCHCOMM_RANK", "TORCHCOMM_SIZE")
TIMEOUT = timedelta(seconds=60)


def exercise(comm, tag, errors, salt=0):
    """A few collectives on comm, checked."""
    import torch
    from torchcomms import ReduceOp

    rank, size = comm.get_rank(), comm.get_size()
    t = torch.full((100,), float(rank + 1 + salt))
    comm.all_reduce(t, ReduceOp.SUM, async_op=False)
    exp = float(size * (size + 1) // 2 + size * salt)
    if not torch.equal(t, torch.full((100,), exp)):
        errors.append(f"[{tag}] all_reduce: got {t[0].item()}, expected {exp}")
    out = torch.zeros(size, dtype=torch.int64)
    comm.all_gather_single(out, torch.tensor([rank * 10 + salt]), async_op=True).wait()
    if out.tolist() != [r * 10 + salt for r in range(size)]:
        errors.append(f"[{tag}] all_gather_single: {out.tolist()}")
    comm.barrier(async_op=False)


def torchrun_main(outdir):
    import torch
    import torch.distributed as dist
    from torchcomms import new_comm

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    errors, comms = [], {}
    try:
        comms["default"] = new_comm("cpu", "cpu", name="default", timeout=TIMEOUT)
        exercise(comms["default"], "default", errors)

        # a TCPStore of our own: rank 0 hosts it on a free port and tells the
        # other ranks the port through the first communicator
        if rank == 0:
            tcp = dist.TCPStore("127.0.0.1", 0, size, True, timeout=TIMEOUT,
                                wait_for_workers=False)
            port = torch.tensor([tcp.port], dtype=torch.int64)
        else:
            port = torch.zeros(1, dtype=torch.int64)
        comms["default"].broadcast(port, 0, async_op=False)
        if rank != 0:
            tcp = dist.TCPStore("127.0.0.1", int(port.item()), size, False, timeout=TIMEOUT)
        comms["tcp"] = new_comm("cpu", "cpu", name="tcp", store=tcp, timeout=TIMEOUT)
        exercise(comms["tcp"], "tcp", errors)
        # a second communicator on the same store (keys are per name)
        comms["tcp2"] = new_comm("cpu", torch.device("cpu"), name="tcp2", store=tcp,
                                 timeout=TIMEOUT)

        comms["prefix"] = new_comm("cpu", "cpu", name="prefix",
                                   store=dist.PrefixStore("pfx", tcp), timeout=TIMEOUT)
        comms["file"] = new_comm("cpu", "cpu", name="file",
                                 store=dist.FileStore(os.path.join(outdir, "filestore"), size),
                                 timeout=TIMEOUT)
        # a client of the launcher's own store
        agent = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), size,
                              False, timeout=TIMEOUT)
        comms["agent"] = new_comm("cpu", "cpu", name="agentclient",
                                  store=dist.PrefixStore("tc_test_agent", agent), timeout=TIMEOUT)
        # name=None: "main"
        comms["main"] = new_comm("cpu", "cpu", store=dist.PrefixStore("unnamed", tcp),
                                 timeout=TIMEOUT)
        if comms["main"].get_name() != "main":
            errors.append(f"name=None gives {comms['main'].get_name()!r}, expected 'main'")

        # all alive together, used interleaved
        for round_ in range(3):
            for i, (tag, c) in enumerate(comms.items()):
                exercise(c, f"{tag} round {round_}", errors, salt=i + round_)
        # async on several communicators at once
        works, ts = [], []
        for c in comms.values():
            t = torch.ones(1000)
            works.append(c.all_reduce(t, __import__("torchcomms").ReduceOp.SUM, async_op=True))
            ts.append(t)
        for w in works:
            w.wait()
        if not all(torch.equal(t, torch.full((1000,), float(size))) for t in ts):
            errors.append("concurrent async all_reduce on several communicators")
        for tag, c in comms.items():
            if c.get_rank() != rank or c.get_size() != size:
                errors.append(f"[{tag}] rank/size {c.get_rank()}/{c.get_size()}")
    except Exception:
        errors.append(traceback.format_exc())
    for c in reversed(list(comms.values())):
        try:
            c.finalize()
        except Exception:
            errors.append(traceback.format_exc())
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump({"errors": errors, "comms": sorted(comms)}, f)
    return 1 if errors else 0


def simple_main(outdir, finalize=True):
    """No store: whatever the launcher (or the bare environment) provides.
    finalize=False: the second communicator is left with an async operation
    never waited on and is not finalized: the process must still exit."""
    import torch
    from torchcomms import ReduceOp, new_comm

    errors = []
    rank = -1
    try:
        c = new_comm("cpu", "cpu", name="simple", timeout=TIMEOUT)
        rank = c.get_rank()
        exercise(c, "simple", errors)
        c2 = new_comm("cpu", "cpu", name="simple2", timeout=TIMEOUT)
        exercise(c2, "simple2", errors, salt=3)
        exercise(c, "simple again", errors, salt=1)
        c.finalize()
        if finalize:
            c2.finalize()
        else:
            c2.all_reduce(torch.ones(10), ReduceOp.SUM, async_op=True)
    except Exception:
        errors.append(traceback.format_exc())
    with open(os.path.join(outdir, f"rank{max(rank, 0)}_{os.getpid()}.json"), "w") as f:
        json.dump({"errors": errors, "rank": rank}, f)
    return 1 if errors else 0


if __name__ == "__main__":
    mode, outdir = sys.argv[1], sys.argv[2]
    if mode == "torchrun":
        sys.exit(torchrun_main(outdir))
    sys.exit(simple_main(outdir, finalize=(mode != "no_finalize")))


# --------------------------------------------------------------------------
# pytest side
# --------------------------------------------------------------------------

import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("torchcomms._comms")
TORCHRUN = Path(sys.executable).with_name("torchrun")
BUILD = Path(os.environ.get("TC_BUILD_DIR", Path(__file__).resolve().parents[2] / "build"))


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    env["OMP_NUM_THREADS"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def launch(cmd, env, timeout):
    """Runs a launcher (torchrun / tcrun) in its own process group; on timeout
    the whole group (launcher and ranks) is killed and returncode is None."""
    p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return subprocess.CompletedProcess(p.args, None, out, err + f"\n*** TIMEOUT after {timeout} s")
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def results(outdir, n, proc):
    log = f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    files = sorted(Path(outdir).glob("rank*.json"))
    assert len(files) == n, f"{len(files)} of {n} ranks wrote results\n{log}"
    errors = []
    for f in files:
        errors += [f"{f.name}: {e}" for e in json.loads(f.read_text())["errors"]]
    assert not errors, "\n".join(errors[:10]) + "\n" + log
    assert proc.returncode == 0, log
    return [json.loads(f.read_text()) for f in files]


def test_stores_under_torchrun(tmp_path):
    p = launch([TORCHRUN, "--standalone", "--nproc_per_node=2", __file__, "torchrun",
                tmp_path], clean_env(), 180)
    res = results(tmp_path, 2, p)
    assert set(res[0]["comms"]) == {"default", "tcp", "tcp2", "prefix", "file", "agent", "main"}


def test_no_store_under_tcrun(tmp_path):
    tcrun = BUILD / "tcrun"
    if not tcrun.exists():
        pytest.skip(f"{tcrun} not built")
    p = launch([tcrun, "-n", "2", "--timeout", "120", sys.executable, __file__, "simple",
                tmp_path], clean_env(), 180)
    res = results(tmp_path, 2, p)
    assert sorted(r["rank"] for r in res) == [0, 1]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_store_plain_env(tmp_path):
    """RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT only, no launcher: rank 0
    hosts the store. The processes then exit without finalizing their second
    communicator (an async operation pending): no hang at exit."""
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, __file__, "no_finalize", str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=clean_env(RANK=r, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1",
                                            MASTER_PORT=port))
             for r in (1, 0)]  # the client first: it must wait for the server
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail("a rank did not exit (hang at exit without finalize?)")
    for p, (o, e) in zip(procs, outs):
        assert p.returncode == 0, o + e
    errors = []
    for f in tmp_path.glob("rank*.json"):
        errors += json.loads(f.read_text())["errors"]
    assert not errors, "\n".join(errors)
    assert len(list(tmp_path.glob("rank*.json"))) == 2


@pytest.fixture
def no_launch_env(monkeypatch):
    for k in LAUNCH_ENV:
        monkeypatch.delenv(k, raising=False)


def test_hash_store_world_size_1(no_launch_env):
    import torch.distributed as dist
    from torchcomms import new_comm

    store = dist.HashStore()
    errors = []
    c1 = new_comm("cpu", "cpu", name="hash1", store=store, timeout=TIMEOUT)
    c2 = new_comm("cpu", "cpu", name="hash2", store=store, timeout=TIMEOUT)
    c3 = new_comm("cpu", "cpu", name="hashpfx", store=dist.PrefixStore("p", store), timeout=TIMEOUT)
    for i, c in enumerate((c1, c2, c3, c1)):
        assert c.get_size() == 1 and c.get_rank() == 0
        exercise(c, f"hash {i}", errors, salt=i)
    assert not errors, errors
    for c in (c3, c2, c1):
        c.finalize()


def test_file_store_world_size_1(no_launch_env, tmp_path):
    import torch.distributed as dist
    from torchcomms import new_comm

    c = new_comm("cpu", "cpu", name="file1", store=dist.FileStore(str(tmp_path / "fs"), 1),
                 timeout=TIMEOUT)
    errors = []
    exercise(c, "file ws1", errors)
    assert not errors, errors
    c.finalize()


def test_no_store_world_size_1(no_launch_env):
    from torchcomms import new_comm

    errors = []
    comms = [new_comm("cpu", "cpu", name=f"inproc{i}", timeout=TIMEOUT) for i in range(3)]
    for i, c in enumerate(comms):
        exercise(c, f"inproc{i}", errors, salt=i)
    assert not errors, errors
    for c in comms:
        c.finalize()

