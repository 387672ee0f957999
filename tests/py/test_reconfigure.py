"""Fault tolerance from Python (issue 14): torchcomms' reconfigure API on the
cpu backend -- get_init_handle, reconfigure(uuid, init_handles, timeout,
hints) with a list, a set or a dict, is_abort_supported, ReconfigureOptions,
InitHandle -- its errors, and recovery without restart: a member SIGKILLed
in the middle of async all_reduces, the survivors abort and shrink, a new
process joins and the group grows back, over shared memory and TCP, with
every value checked exactly (tests/py/workers/reconfig_worker.py).

The recovery test sets the transport itself (shared memory at 3 processes,
TCP at 4), so the TCP pass of `make test` skips it. The C suite
(tests/c/test_reconfig.c) covers split brain, dead handles and epochs."""
import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import torchcomms
from torchcomms import ReduceOp

HERE = Path(__file__).resolve().parent
WORKER = HERE / "workers" / "reconfig_worker.py"
LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
              "TORCHCOMM_RANK", "TORCHCOMM_SIZE", "TORCHCOMMS_CPU_TRANSPORT")


def new_rc(name="ft", **kw):
    return torchcomms.new_comm("cpu", torch.device("cpu"), name=name, enable_reconfigure=True,
                               **kw)


def test_names_and_defaults():
    assert torchcomms.InitHandle is str
    o = torchcomms.ReconfigureOptions()
    assert (o.uuid, o.init_handles, o.timeout, o.hints) == (0, [], None, {})
    o = torchcomms.ReconfigureOptions(uuid=4, init_handles={"a"}, timeout=timedelta(seconds=3),
                                      hints={"k": "v"})
    assert (o.uuid, o.init_handles, o.timeout, o.hints) == (4, {"a"}, timedelta(seconds=3),
                                                            {"k": "v"})
    assert torchcomms.ReconfigureOptions.__module__ == "torchcomms._comms"


def test_without_enable_reconfigure():
    c = torchcomms.new_comm("cpu", torch.device("cpu"), name="plain", rank=0, size=1)
    assert c.is_abort_supported() is True
    assert c.get_options().enable_reconfigure is False
    with pytest.raises(RuntimeError, match="not created with enable_reconfigure=True: only a "
                       "reconfigurable communicator has an init handle"):
        c.get_init_handle()
    with pytest.raises(RuntimeError, match=r"^torchcomms: reconfigure on 'plain' \(rank 0 of 1\): "
                       "the communicator was not created with enable_reconfigure=True"):
        c.reconfigure(uuid=0, init_handles=["test_handle"], timeout=timedelta(seconds=5))
    c.finalize()


def test_unsupported_backend():
    """A backend without reconfigure (here one written in Python) refuses
    enable_reconfigure=True with RuntimeError, as torchcomms' do."""
    class NoFT(torchcomms.TorchCommBackend):
        def init(self, device, name, options):
            pass

        def get_rank(self):
            return 0

        def get_size(self):
            return 1

        def finalize(self):
            pass

    torchcomms.register_backend("noft", NoFT)
    with pytest.raises(RuntimeError, match="backend 'noft' does not support "
                       r"enable_reconfigure=True \(reconfigure not implemented\)"):
        torchcomms.new_comm("noft", torch.device("cpu"), name="x", enable_reconfigure=True)


def test_dynamic_regime_and_argument_errors():
    c = new_rc(timeout=timedelta(seconds=10))
    h = c.get_init_handle()
    assert isinstance(h, str) and h.startswith("torchcomms:cpu:")
    assert (c.get_rank(), c.get_size()) == (-1, 0)
    assert c.get_options().enable_reconfigure is True
    with pytest.raises(RuntimeError, match="has no members: it was created with "
                       r"enable_reconfigure=True and is configured by reconfigure"):
        c.all_reduce(torch.ones(2), ReduceOp.SUM, False)
    with pytest.raises(TypeError, match="argument 'uuid' must be an int, not str"):
        c.reconfigure("1", [h])
    with pytest.raises(TypeError, match=r"init_handles\[1\] must be a str"):
        c.reconfigure(1, [h, 5])
    with pytest.raises(TypeError, match="init_handles must be a list"):
        c.reconfigure(1, h)
    with pytest.raises(ValueError, match="maps a handle to rank 3"):
        c.reconfigure(1, {h: 3})
    with pytest.raises(RuntimeError, match="does not contain this communicator's handle"):
        c.reconfigure(1, ["torchcomms:cpu:0123456789abcdef:127.0.0.1:9"])
    with pytest.raises(RuntimeError, match="is not an init handle"):
        c.reconfigure(1, ["test_handle"])
    assert c.get_size() == 0
    # a group of one, in each of the three forms, a new epoch each time
    for uuid, hs in ((1, [h]), (2, {h}), (3, {h: 0})):
        w = c.reconfigure(uuid, hs, timedelta(seconds=5), {"k": "v"})
        assert w.is_completed()
        w.wait()
        assert (c.get_rank(), c.get_size()) == (0, 1)
        t = torch.arange(4.0)
        c.all_reduce(t, ReduceOp.SUM, False)
        assert torch.equal(t, torch.arange(4.0))
    o = torchcomms.ReconfigureOptions(uuid=4, init_handles=[h], timeout=timedelta(seconds=5))
    c.reconfigure(o.uuid, o.init_handles, o.timeout, o.hints).wait()
    c.abort()
    with pytest.raises(RuntimeError, match=r"aborted \(reconfigure it into a new group"):
        c.barrier(False)
    c.reconfigure(uuid=5, init_handles=[h]).wait()
    c.barrier(False)
    c.finalize()
    with pytest.raises(RuntimeError, match="finalized"):
        c.reconfigure(uuid=6, init_handles=[h])


def test_set_assigns_the_same_ranks_everywhere():
    """A set of handles is sorted: two communicators of one process get the
    ranks of the sorted order (threads stand in for two processes)."""
    import threading
    a, b = new_rc("sa"), new_rc("sb")
    hs = {a.get_init_handle(), b.get_init_handle()}
    errs = []

    def go(c):
        try:
            c.reconfigure(uuid=11, init_handles=hs, timeout=timedelta(seconds=20)).wait()
        except Exception as e:  # noqa: BLE001
            errs.append(e)
    ts = [threading.Thread(target=go, args=(c,)) for c in (a, b)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert not errs and not any(t.is_alive() for t in ts)
    order = sorted(hs)
    assert a.get_rank() == order.index(a.get_init_handle())
    assert b.get_rank() == order.index(b.get_init_handle())
    assert a.get_size() == b.get_size() == 2
    x, y = torch.ones(3), torch.full((3,), 2.0)
    wa = a.all_reduce(x, ReduceOp.SUM, True)
    wb = b.all_reduce(y, ReduceOp.SUM, True)
    wa.wait()
    wb.wait()
    assert torch.equal(x, torch.full((3,), 3.0)) and torch.equal(y, x)
    ta = threading.Thread(target=a.finalize)
    ta.start()
    b.finalize()
    ta.join(30)


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(os.environ.get("TORCHCOMMS_CPU_TRANSPORT") == "tcp",
                    reason="chooses its transports itself (runs in the shared-memory pass)")
@pytest.mark.parametrize("n,transport", [(3, "shm"), (4, "tcp")])
def test_kill_shrink_grow(n, transport):
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=90))
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    env.update(OMP_NUM_THREADS="1", TORCHCOMMS_CPU_TRANSPORT=transport)
    victim = 1
    shm_before = {f for f in os.listdir("/dev/shm") if f.startswith("torchcomms")}

    def start(role, slot):
        return subprocess.Popen([sys.executable, str(WORKER), role, str(slot), str(n), str(port),
                                 str(victim)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    procs = [start("member", r) for r in range(n)]
    try:
        try:
            store.wait(["shrunk_all"], timedelta(seconds=90))
        except Exception:  # noqa: BLE001 -- say what every worker did
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
            outs = [p.communicate(timeout=30)[0] for p in procs]
            pytest.fail("the survivors did not all shrink:\n" + "\n".join(
                f"--- member {i} (exit {p.returncode}):\n{o}" for i, (p, o) in
                enumerate(zip(procs, outs))))
        procs.append(start("replacement", n - 1))
        outs = []
        for p in procs:
            out, _ = p.communicate(timeout=90)
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert procs[victim].returncode == -signal.SIGKILL, outs[victim]
    results = []
    for i, p in enumerate(procs):
        if i == victim:
            continue
        role, slot = ("replacement", n - 1) if i == n else ("member", i)
        res = json.loads(store.get(f"result/{role}{slot}"))
        assert res["ok"], res.get("error", "") + outs[i]
        assert p.returncode == 0, outs[i]
        results.append(res)
    members = [r for r in results if r["role"] == "member"]
    assert len(members) == n - 1 and all(r["checks"] for r in results)
    assert any(f"peer {victim}" in r["err"] for r in members), [r["err"] for r in members]
    resume = max(r["resume_s"] for r in members)
    print(f"{transport} n={n}: kill -> first all_reduce of the shrunk group: {resume:.3f} s; "
          f"reconfigure {max(r['reconfigure_s'] for r in members):.3f} s")
    assert resume < 20
    shm_after = {f for f in os.listdir("/dev/shm") if f.startswith("torchcomms")}
    assert shm_after <= shm_before, shm_after - shm_before
