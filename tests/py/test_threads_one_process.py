"""Several ranks of one communicator as threads of one process (torchft's
and torch's threaded test cases run each replica group that way).

Each test starts N threads in this process; thread r creates rank r of one
communicator over a shared store (new_comm(..., store=..., rank=r, size=N)),
runs collectives, point-to-point and a split checked exactly, and
finalizes. Over shared memory and over TCP (TORCHCOMMS_CPU_TRANSPORT=tcp,
read at each creation), with torch's TCPStore (through a PrefixStore per
thread, as torchft does), torch's HashStore and FileStore, and ours (no
store: MASTER_ADDR/MASTER_PORT, the library's TCPStore server and client,
shared by every thread). Also: a communicator name reused, an operation that
times out in one thread, abort from one thread.

Every thread is joined with a deadline: a stuck thread fails the test with
the stacks of all threads instead of hanging it.

Run: TC_BUILD_DIR=build .venv/bin/python -m pytest -q tests/py/test_threads_one_process.py
"""

import faulthandler
import io
import os
import socket
import tempfile
import threading
import time
import traceback
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
import torchcomms  # noqa: E402
from torchcomms import ReduceOp  # noqa: E402

LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
              "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID",
              "TORCHCOMM_RANK", "TORCHCOMM_SIZE", "TORCHCOMMS_CPU_TRANSPORT")
JOIN_S = 30.0          # a thread not done by then is stuck
TIMEOUT = timedelta(seconds=20)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def env(monkeypatch):
    for k in LAUNCH_ENV:
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


_names = iter(range(10**6))


def make_store(kind, n, monkeypatch):
    """A function of the rank giving new_comm's store argument(s)."""
    if kind == "torch_tcp":
        base = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                             timeout=TIMEOUT)
        return lambda r: {"store": dist.PrefixStore("pg", base)}
    if kind == "hash":
        base = dist.HashStore()
        return lambda r: {"store": base}
    if kind == "file":
        base = dist.FileStore(tempfile.mktemp(prefix="tc_threads_"), n)
        return lambda r: {"store": dist.PrefixStore("pg", base)}
    assert kind == "ours"
    # the process's default store: rank 0's thread hosts the server, every
    # thread is a client (one connection, shared: the first one made)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    return lambda r: {}


def run_threads(n, fn):
    """Runs fn(rank, barrier) in n threads; fails on the first error, or on a
    thread still running after JOIN_S (with every thread's stack)."""
    errors = {}
    barrier = threading.Barrier(n, timeout=JOIN_S)

    def body(r):
        try:
            fn(r, barrier)
        except BaseException:  # noqa: B902 -- reported to the test
            errors[r] = traceback.format_exc()
            barrier.abort()

    threads = [threading.Thread(target=body, args=(r,), daemon=True,
                                name=f"rank{r}") for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
    stuck = [t.name for t in threads if t.is_alive()]
    if stuck:
        buf = io.StringIO()
        with tempfile.TemporaryFile("w+") as f:
            faulthandler.dump_traceback(file=f, all_threads=True)
            f.seek(0)
            buf.write(f.read())
        pytest.fail(f"threads {stuck} still running after {JOIN_S} s:\n{buf.getvalue()}")
    if errors:
        pytest.fail("\n".join(f"rank {r}:\n{e}" for r, e in sorted(errors.items())))


def exercise(c, r, n):
    """Creation is done; every operation of the brief, checked exactly."""
    base = torch.arange(1001, dtype=torch.float64)
    t = base + r
    c.all_reduce(t, ReduceOp.SUM, async_op=False)
    assert torch.equal(t, base * n + n * (n - 1) / 2)
    m = torch.tensor([r * 3 - 1], dtype=torch.int64)
    c.all_reduce(m, ReduceOp.MAX, async_op=False)
    assert m.item() == (n - 1) * 3 - 1

    for root in (0, n - 1):
        b = torch.full((70000,), float(r))  # large enough for the pipelined paths
        c.broadcast(b, root, async_op=False)
        assert torch.equal(b, torch.full((70000,), float(root)))

    outs = [torch.empty(5, dtype=torch.int32) for _ in range(n)]
    c.all_gather(outs, torch.full((5,), r * 7, dtype=torch.int32), async_op=False)
    assert [o.tolist() for o in outs] == [[i * 7] * 5 for i in range(n)]
    single = torch.empty(2 * n)
    c.all_gather_single(single, torch.tensor([r, -r], dtype=torch.float32),
                        async_op=False)
    assert single.tolist() == [v for i in range(n) for v in (i, -i)]

    # a ring of send/recv: even ranks send first, odd ranks receive first
    nxt, prv = (r + 1) % n, (r - 1) % n
    s, got = torch.full((9,), float(r)), torch.empty(9)
    if r % 2 == 0:
        c.send(s, nxt, async_op=False)
        c.recv(got, prv, async_op=False)
    else:
        c.recv(got, prv, async_op=False)
        c.send(s, nxt, async_op=False)
    assert torch.equal(got, torch.full((9,), float(prv)))
    # and the same ring asynchronously, both posted before either waits
    got2 = torch.empty(9)
    ws = [c.send(s, nxt, async_op=True), c.recv(got2, prv, async_op=True)]
    for w in ws:
        w.wait()
    assert torch.equal(got2, torch.full((9,), float(prv)))

    # several async collectives in flight from every thread at once
    ts = [torch.full((33,), float(r + k)) for k in range(4)]
    works = [c.all_reduce(x, ReduceOp.SUM, async_op=True) for x in ts]
    for k, (w, x) in enumerate(zip(works, ts)):
        w.wait()
        assert torch.equal(x, torch.full((33,), float(n * (n - 1) // 2 + n * k)))
    c.barrier(async_op=False)

    # split into even and odd ranks: the children meet within each thread group
    group = [i for i in range(n) if i % 2 == r % 2]
    child = c.split(group, "half")
    v = torch.tensor([float(r)])
    child.all_reduce(v, ReduceOp.SUM, async_op=False)
    assert v.item() == float(sum(group))
    child.finalize()


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("store", ["torch_tcp", "hash", "ours"])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_ranks_as_threads(env, transport, store, n):
    if transport == "tcp":
        env.setenv("TORCHCOMMS_CPU_TRANSPORT", "tcp")
    store_of = make_store(store, n, env)
    name = f"thr{next(_names)}"

    def rank_main(r, barrier):
        c = torchcomms.new_comm("cpu", torch.device("cpu"), name=name, timeout=TIMEOUT,
                                rank=r, size=n, **store_of(r))
        assert (c.get_rank(), c.get_size()) == (r, n)
        exercise(c, r, n)
        c.finalize()

    run_threads(n, rank_main)


def test_file_store(env):
    store_of = make_store("file", 2, env)

    def rank_main(r, barrier):
        c = torchcomms.new_comm("cpu", "cpu", name="thr_file", timeout=TIMEOUT,
                                rank=r, size=2, **store_of(r))
        exercise(c, r, 2)
        c.finalize()

    run_threads(2, rank_main)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_name_reused_and_two_alive(env, transport):
    """Each thread creates the same name twice in a row (the store keys of
    the second are new) and a second communicator alive beside it."""
    if transport == "tcp":
        env.setenv("TORCHCOMMS_CPU_TRANSPORT", "tcp")
    base = dist.HashStore()
    n = 3
    name = f"again{next(_names)}"

    def rank_main(r, barrier):
        for k in range(2):
            c = torchcomms.new_comm("cpu", "cpu", name=name, store=base, timeout=TIMEOUT,
                                    rank=r, size=n)
            d = torchcomms.new_comm("cpu", "cpu", name=name + "_b", store=base,
                                    timeout=TIMEOUT, rank=n - 1 - r, size=n)
            t, u = torch.full((3,), float(r + k)), torch.full((3,), float(r))
            wt = c.all_reduce(t, ReduceOp.SUM, async_op=True)
            d.all_reduce(u, ReduceOp.SUM, async_op=False)
            wt.wait()
            assert torch.equal(t, torch.full((3,), float(n * (n - 1) // 2 + n * k)))
            assert torch.equal(u, torch.full((3,), float(n * (n - 1) // 2)))
            d.finalize()
            c.finalize()

    run_threads(n, rank_main)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_timeout_in_one_thread_does_not_wedge_the_other(env, transport):
    if transport == "tcp":
        env.setenv("TORCHCOMMS_CPU_TRANSPORT", "tcp")
    base = dist.HashStore()
    name = f"tmo{next(_names)}"

    def rank_main(r, barrier):
        c = torchcomms.new_comm("cpu", "cpu", name=name, store=base, timeout=TIMEOUT,
                                rank=r, size=2)
        if r == 0:  # alone in a recv from rank 1, which sends nothing
            with pytest.raises(RuntimeError, match=r"recv .*rank 0 of 2.*timed out"):
                c.recv(torch.empty(4), 1, async_op=False, timeout=timedelta(seconds=0.5))
            barrier.wait()
            c.abort()
        else:  # meanwhile rank 1 is free to run, and learns of the abort
            barrier.wait()
            t0 = time.monotonic()
            with pytest.raises(RuntimeError, match=r"rank 1 of 2"):
                c.recv(torch.empty(4), 0, async_op=False)
            assert time.monotonic() - t0 < TIMEOUT.total_seconds() / 2
            try:
                c.finalize()
            except RuntimeError:
                pass  # an earlier operation failed: reported, not hung

    run_threads(2, rank_main)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_abort_from_one_thread(env, transport):
    """Rank 1 blocks in a recv; rank 0 aborts; rank 1's recv fails at once
    (not after its 20 s timeout), and its finalize returns."""
    if transport == "tcp":
        env.setenv("TORCHCOMMS_CPU_TRANSPORT", "tcp")
    base = dist.HashStore()
    name = f"abort{next(_names)}"

    def rank_main(r, barrier):
        c = torchcomms.new_comm("cpu", "cpu", name=name, store=base, timeout=TIMEOUT,
                                rank=r, size=2)
        c.barrier(async_op=False)
        if r == 0:
            w = c.all_reduce(torch.ones(2), ReduceOp.SUM, async_op=True)  # rank 1 joins
            w.wait()
            c.abort()
            assert c.is_aborted()
        else:
            c.all_reduce(torch.ones(2), ReduceOp.SUM, async_op=False)
            t0 = time.monotonic()
            with pytest.raises(RuntimeError, match=r"recv on .*rank 1 of 2.*peer 0"):
                c.recv(torch.empty(4), 0, async_op=False)
            assert time.monotonic() - t0 < TIMEOUT.total_seconds() / 2
            try:
                c.finalize()
            except RuntimeError:
                pass

    run_threads(2, rank_main)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_reconfigure_as_threads(env, transport):
    """Reconfigurable communicators as threads of one process (torchft's
    replica groups): form a group of 4 from the handles, shrink to the 3
    that remain after one thread aborts and leaves, grow back with a new
    communicator, every value checked (issue 14, point 5)."""
    if transport == "tcp":
        env.setenv("TORCHCOMMS_CPU_TRANSPORT", "tcp")
    n = 4
    comms = [torchcomms.new_comm("cpu", "cpu", name="ftthr", enable_reconfigure=True,
                                 timeout=TIMEOUT) for _ in range(n)]
    hs = [c.get_init_handle() for c in comms]
    late = torchcomms.new_comm("cpu", "cpu", name="ftthr", enable_reconfigure=True,
                               timeout=TIMEOUT)

    def rank_main(r, barrier):
        c = comms[r]
        c.reconfigure(uuid=1, init_handles=hs, timeout=TIMEOUT).wait()
        assert (c.get_rank(), c.get_size()) == (r, n)
        t = torch.full((5,), float(r + 1))
        c.all_reduce(t, ReduceOp.SUM, async_op=False)
        assert torch.equal(t, torch.full((5,), float(n * (n + 1) // 2)))
        barrier.wait()
        if r == n - 1:  # leaves: abort, and take no part in what follows
            c.abort()
            c.finalize()
            return
        c.abort()
        c.reconfigure(uuid=2, init_handles=hs[:n - 1], timeout=TIMEOUT).wait()
        assert (c.get_rank(), c.get_size()) == (r, n - 1)
        t = torch.full((5,), float(r + 1))
        c.all_reduce(t, ReduceOp.SUM, async_op=False)
        assert torch.equal(t, torch.full((5,), float((n - 1) * n // 2)))
        exercise(c, r, n - 1)  # every operation works in the new group
        if r == 0:  # a new member joins from this thread too
            grown = hs[:n - 1] + [late.get_init_handle()]
            w = [None]
            th = threading.Thread(target=lambda: w.__setitem__(
                0, late.reconfigure(uuid=3, init_handles=grown, timeout=TIMEOUT)))
            th.start()
            c.reconfigure(uuid=3, init_handles=grown, timeout=TIMEOUT).wait()
            th.join(JOIN_S)
            assert not th.is_alive() and w[0] is not None
        else:
            c.reconfigure(uuid=3, init_handles=hs[:n - 1] + [late.get_init_handle()],
                          timeout=TIMEOUT).wait()
        assert (c.get_rank(), c.get_size()) == (r, n)
        if r == 0:
            lt = torch.full((5,), float(n))
            wl = late.all_reduce(lt, ReduceOp.SUM, async_op=True)
        t = torch.full((5,), float(r + 1))
        c.all_reduce(t, ReduceOp.SUM, async_op=False)
        assert torch.equal(t, torch.full((5,), float(n * (n + 1) // 2)))
        if r == 0:
            wl.wait()
            assert torch.equal(lt, t)
            fin = threading.Thread(target=late.finalize)
            fin.start()
        c.finalize()
        if r == 0:
            fin.join(JOIN_S)
            assert not fin.is_alive()

    run_threads(n, rank_main)
