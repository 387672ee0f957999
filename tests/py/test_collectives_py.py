"""TorchComm (the Python package over libtorchcomms) on real processes.

1. Every operation, dtype, reduction and size, exactly against local
   references: workers/collectives_worker.py runs every case on every rank;
   ONE launch per world size (1: a plain subprocess with no launcher env, the
   in-process store; 2 and 4: torchrun --standalone), then one pytest test per
   (world size, category) reports that category's failures with details.
2. Misuse at world size 1, in this process (no environment needed): lists of
   the wrong length or with mismatched sizes / dtypes, tensors on another
   device ("meta"), non-contiguous, conjugate, negative views, unsupported
   dtypes, ranks out of range, use after finalize / abort.

Run: TC_BUILD_DIR=build .venv/bin/python -m pytest -q tests/py/test_collectives_py.py
"""

import importlib.util
import json
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
torchcomms = pytest.importorskip("torchcomms")
pytest.importorskip("torchcomms._comms")
from torchcomms import ReduceOp  # noqa: E402

HERE = Path(__file__).resolve().parent
WORKER = HERE / "workers" / "collectives_worker.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
              "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
              "TORCHELASTIC_RUN_ID", "TORCHCOMM_RANK", "TORCHCOMM_SIZE",
              "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
              "SLURM_PROCID", "SLURM_NTASKS")
WORLD_TIMEOUT = 300


def _load_worker():
    spec = importlib.util.spec_from_file_location("collectives_worker", WORKER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


W = _load_worker()
CATEGORIES = [name for name, _ in W.CATEGORIES]
# categories that legitimately run no case at some world size
EMPTY_OK = {1: {"send_recv", "rounding", "gil", "timeout", "mismatch"}, 2: set(),
            4: {"rounding"}}


def clean_env():
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    env["OMP_NUM_THREADS"] = "1"
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


class World:
    def __init__(self, size, proc, results):
        self.size, self.proc, self.results = size, proc, results

    def log(self):
        return (f"exit {self.proc.returncode}\n--- stdout\n{self.proc.stdout[-6000:]}"
                f"\n--- stderr\n{self.proc.stderr[-6000:]}")


_worlds = {}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    def get(size):
        if size not in _worlds:
            out = tmp_path_factory.mktemp(f"collectives_ws{size}")
            if size == 1:
                cmd = [sys.executable, str(WORKER), str(out)]
            else:
                cmd = [str(TORCHRUN), "--standalone", f"--nproc_per_node={size}",
                       str(WORKER), str(out)]
            proc = launch(cmd, clean_env(), WORLD_TIMEOUT)
            results = {}
            for r in range(size):
                f = out / f"rank{r}.json"
                if f.exists():
                    results[r] = json.loads(f.read_text())
            _worlds[size] = World(size, proc, results)
        return _worlds[size]

    return get


@pytest.mark.parametrize("size", [1, 2, 4])
def test_world_ran(world, size):
    """The launch itself: every rank finished and wrote its results."""
    w = world(size)
    assert sorted(w.results) == list(range(size)), w.log()
    for r, res in w.results.items():
        assert res["size"] == size and res["rank"] == r
        fatal = [f for f in res["failures"] if f["category"] == "finalize"]
        assert not fatal, fatal
    total = sum(sum(res["cases"].values()) for res in w.results.values())
    assert total > 500 * size, f"only {total} cases ran"
    # failures are reported per category below; the exit code follows them
    if not any(res["failures"] for res in w.results.values()):
        assert w.proc.returncode == 0, w.log()


@pytest.mark.parametrize("category", CATEGORIES)
@pytest.mark.parametrize("size", [1, 2, 4])
def test_category(world, size, category):
    w = world(size)
    if not w.results:
        pytest.fail("no rank wrote results\n" + w.log())
    failures = []
    for r, res in sorted(w.results.items()):
        for f in res["failures"]:
            if f["category"] == category:
                failures.append(f"rank {r}: {f['case']}: {f['error']}")
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:30])
    if category not in EMPTY_OK[size]:
        counts = [res["cases"].get(category, 0) for res in w.results.values()]
        assert max(counts) > 0, f"no case of {category} ran: {counts}"


# --------------------------------------------------------------------------
# Misuse, world size 1, in this process
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def comm():
    with pytest.MonkeyPatch.context() as mp:
        for k in LAUNCH_ENV:
            mp.delenv(k, raising=False)
        c = torchcomms.new_comm("cpu", torch.device("cpu"), name="pyerrors",
                                timeout=timedelta(seconds=30))
    assert c.get_size() == 1
    yield c
    c.finalize()


def z(n, dtype=torch.float32):
    return torch.zeros(n, dtype=dtype)


def _raises(exc, fn, *args, match=None, **kw):
    with pytest.raises(exc, match=match) as info:
        fn(*args, **kw)
    return info


def assert_usable(comm):
    t = torch.full((3,), 2.0)
    comm.all_reduce(t, ReduceOp.SUM, async_op=False)
    assert torch.equal(t, torch.full((3,), 2.0))


def test_list_length_is_not_world_size(comm):
    two = [z(4), z(4)]
    cases = [
        ("all_gather", lambda: comm.all_gather(two, z(4), async_op=False)),
        ("all_gather empty", lambda: comm.all_gather([], z(4), async_op=False)),
        ("all_gather_v", lambda: comm.all_gather_v(two, z(4), async_op=False)),
        ("reduce_scatter", lambda: comm.reduce_scatter(z(4), two, ReduceOp.SUM, async_op=False)),
        ("reduce_scatter_v", lambda: comm.reduce_scatter_v(z(4), two, ReduceOp.SUM, async_op=False)),
        ("all_to_all out", lambda: comm.all_to_all(two, [z(4)], async_op=False)),
        ("all_to_all in", lambda: comm.all_to_all([z(4)], two, async_op=False)),
        ("scatter at root", lambda: comm.scatter(z(4), two, 0, async_op=False)),
        ("gather at root", lambda: comm.gather(two, z(4), 0, async_op=False)),
        ("all_to_all_v_single out splits",
         lambda: comm.all_to_all_v_single(z(4), z(4), [2, 2], [4], async_op=False)),
        ("all_to_all_v_single in splits",
         lambda: comm.all_to_all_v_single(z(4), z(4), [4], [2, 2], async_op=False)),
    ]
    for name, fn in cases:
        with pytest.raises(ValueError):
            fn()
            pytest.fail(f"{name}: no error")
    assert_usable(comm)


def test_mismatched_sizes(comm):
    cases = [
        ("all_gather list", lambda: comm.all_gather([z(3)], z(4), async_op=False)),
        ("all_gather_v [rank]", lambda: comm.all_gather_v([z(3)], z(4), async_op=False)),
        ("all_gather_single", lambda: comm.all_gather_single(z(3), z(4), async_op=False)),
        ("reduce_scatter list", lambda: comm.reduce_scatter(z(4), [z(3)], ReduceOp.SUM, async_op=False)),
        ("reduce_scatter_v [rank]",
         lambda: comm.reduce_scatter_v(z(4), [z(3)], ReduceOp.SUM, async_op=False)),
        ("reduce_scatter_single",
         lambda: comm.reduce_scatter_single(z(4), z(3), ReduceOp.SUM, async_op=False)),
        ("all_to_all_single", lambda: comm.all_to_all_single(z(4), z(3), async_op=False)),
        ("all_to_all_v_single in sum",
         lambda: comm.all_to_all_v_single(z(4), z(4), [4], [3], async_op=False)),
        ("all_to_all_v_single out sum",
         lambda: comm.all_to_all_v_single(z(4), z(4), [5], [4], async_op=False)),
        ("all_to_all_v_single negative split",
         lambda: comm.all_to_all_v_single(z(4), z(4), [-1], [4], async_op=False)),
        ("scatter list", lambda: comm.scatter(z(4), [z(3)], 0, async_op=False)),
        ("gather list", lambda: comm.gather([z(3)], z(4), 0, async_op=False)),
        ("gather_single", lambda: comm.gather_single(z(3), z(4), 0, async_op=False)),
    ]
    for name, fn in cases:
        with pytest.raises(ValueError):
            fn()
            pytest.fail(f"{name}: no error")
    assert_usable(comm)


def test_mismatched_dtypes(comm):
    i32 = torch.int32
    cases = [
        ("all_gather", lambda: comm.all_gather([z(4, i32)], z(4), async_op=False)),
        ("all_gather_single", lambda: comm.all_gather_single(z(4, i32), z(4), async_op=False)),
        ("reduce_scatter", lambda: comm.reduce_scatter(z(4), [z(4, i32)], ReduceOp.SUM, async_op=False)),
        ("all_to_all_single", lambda: comm.all_to_all_single(z(4), z(4, i32), async_op=False)),
        ("all_to_all", lambda: comm.all_to_all([z(4)], [z(4, i32)], async_op=False)),
        ("scatter", lambda: comm.scatter(z(4), [z(4, i32)], 0, async_op=False)),
        ("gather", lambda: comm.gather([z(4, i32)], z(4), 0, async_op=False)),
    ]
    for name, fn in cases:
        with pytest.raises((ValueError, TypeError)):
            fn()
            pytest.fail(f"{name}: no error")
    assert_usable(comm)


def _every_op_with(comm, make_bad):
    """Calls every operation with one bad tensor argument at a time."""
    # (send / recv at world size 1 would be to self, which is an error of its
    # own; they are covered through the batch below, where self is allowed)
    g = z(4)
    yield "broadcast", lambda: comm.broadcast(make_bad(), 0, async_op=False)
    yield "all_reduce", lambda: comm.all_reduce(make_bad(), ReduceOp.SUM, async_op=False)
    yield "reduce", lambda: comm.reduce(make_bad(), 0, ReduceOp.SUM, async_op=False)
    yield "all_gather in", lambda: comm.all_gather([z(4)], make_bad(), async_op=False)
    yield "all_gather out", lambda: comm.all_gather([make_bad()], g, async_op=False)
    yield "all_gather_v out", lambda: comm.all_gather_v([make_bad()], g, async_op=False)
    yield "all_gather_single out", lambda: comm.all_gather_single(make_bad(), g, async_op=False)
    yield "all_gather_single in", lambda: comm.all_gather_single(z(4), make_bad(), async_op=False)
    yield "reduce_scatter in", lambda: comm.reduce_scatter(g, [make_bad()], ReduceOp.SUM, async_op=False)
    yield "reduce_scatter out", lambda: comm.reduce_scatter(make_bad(), [z(4)], ReduceOp.SUM, async_op=False)
    yield "reduce_scatter_v in", lambda: comm.reduce_scatter_v(g, [make_bad()], ReduceOp.SUM, async_op=False)
    yield "reduce_scatter_single", lambda: comm.reduce_scatter_single(
        make_bad(), z(4), ReduceOp.SUM, async_op=False)
    yield "all_to_all_single", lambda: comm.all_to_all_single(z(4), make_bad(), async_op=False)
    yield "all_to_all_v_single", lambda: comm.all_to_all_v_single(
        make_bad(), z(4), [4], [4], async_op=False)
    yield "all_to_all", lambda: comm.all_to_all([z(4)], [make_bad()], async_op=False)
    yield "scatter out", lambda: comm.scatter(make_bad(), [z(4)], 0, async_op=False)
    yield "scatter in", lambda: comm.scatter(z(4), [make_bad()], 0, async_op=False)
    yield "gather in", lambda: comm.gather([z(4)], make_bad(), 0, async_op=False)
    yield "gather out", lambda: comm.gather([make_bad()], g, 0, async_op=False)
    yield "gather_single", lambda: comm.gather_single(make_bad(), g, 0, async_op=False)

    def batch():
        b = comm.batch_op_create()
        b.send(make_bad(), 0)
        b.recv(z(4), 0)
        b.issue(async_op=False)
    yield "batch", batch


def _check_all(comm, make_bad, exc, match=None):
    wrong = []
    for name, fn in _every_op_with(comm, make_bad):
        try:
            fn()
        except exc as e:
            if match and match not in str(e):
                wrong.append(f"{name}: message {str(e)!r} lacks {match!r}")
        except Exception as e:  # noqa: BLE001
            wrong.append(f"{name}: {type(e).__name__}: {e}")
        else:
            wrong.append(f"{name}: no error")
    assert not wrong, "\n".join(wrong)
    assert_usable(comm)


def test_wrong_device_meta(comm):
    _check_all(comm, lambda: torch.zeros(4, device="meta"), ValueError)


def test_non_contiguous(comm):
    t = torch.zeros(2, 2).t()
    assert not t.is_contiguous() and t.numel() == 4
    _check_all(comm, lambda: torch.zeros(2, 2).t(), ValueError)
    _check_all(comm, lambda: torch.zeros(8)[::2], ValueError)
    _check_all(comm, lambda: torch.zeros(1).expand(4), ValueError)  # stride 0
    _check_all(comm, lambda: torch.zeros(1, 2, 2, 1).to(memory_format=torch.channels_last)
               .permute(0, 3, 1, 2), ValueError)


def test_negative_view(comm):
    t = torch._neg_view(torch.zeros(4))
    assert t.is_neg()
    _check_all(comm, lambda: torch._neg_view(torch.zeros(4)), ValueError)


def test_complex_and_conj(comm):
    _check_all(comm, lambda: torch.zeros(4, dtype=torch.complex64), TypeError)
    t = torch.zeros(4, dtype=torch.complex64).conj()
    assert t.is_conj()
    # conjugate views are complex: an unsupported dtype (TypeError) or a
    # conjugate view (ValueError), either way rejected
    _check_all(comm, lambda: torch.zeros(4, dtype=torch.complex64).conj(), (TypeError, ValueError))


# (float8_e4m3fn and float8_e5m2 are supported: tests/py/test_fp8_py.py)
@pytest.mark.parametrize("dtype", ["uint16", "uint32", "uint64", "float8_e4m3fnuz",
                                   "float8_e5m2fnuz", "complex128"])
def test_unsupported_dtypes(comm, dtype):
    if not hasattr(torch, dtype):
        pytest.skip(f"torch.{dtype} missing")
    dt = getattr(torch, dtype)
    _check_all(comm, lambda: torch.zeros(4, dtype=dt), TypeError)


def test_op_not_allowed_for_dtype(comm):
    bad = [
        (torch.float32, ReduceOp.BAND), (torch.float64, ReduceOp.BOR),
        (torch.bfloat16, ReduceOp.BXOR), (torch.float16, ReduceOp.BAND),
        (torch.bool, ReduceOp.AVG), (torch.int32, ReduceOp.PREMUL_SUM(2.0)),
        (torch.bool, ReduceOp.PREMUL_SUM(1.0)),
    ]
    for dtype, op in bad:
        for fn in (lambda: comm.all_reduce(z(4, dtype), op, async_op=False),
                   lambda: comm.reduce(z(4, dtype), 0, op, async_op=False),
                   lambda: comm.reduce_scatter(z(4, dtype), [z(4, dtype)], op, async_op=False),
                   lambda: comm.reduce_scatter_single(z(4, dtype), z(4, dtype), op, async_op=False)):
            with pytest.raises(TypeError):
                fn()
    assert_usable(comm)


def test_rank_out_of_range(comm):
    for r in (1, -1, 1 << 40):
        for fn in (lambda: comm.broadcast(z(4), r, async_op=False),
                   lambda: comm.reduce(z(4), r, ReduceOp.SUM, async_op=False),
                   lambda: comm.scatter(z(4), [z(4)], r, async_op=False),
                   lambda: comm.gather([z(4)], z(4), r, async_op=False),
                   lambda: comm.gather_single(z(4), z(4), r, async_op=False),
                   lambda: comm.send(z(4), r, async_op=False),
                   lambda: comm.recv(z(4), r, async_op=False)):
            with pytest.raises((ValueError, OverflowError)):
                fn()
    b = comm.batch_op_create()
    with pytest.raises(ValueError):
        b.send(z(4), 1)
        b.issue(async_op=False)
    assert_usable(comm)


def test_not_a_tensor(comm):
    for fn in (lambda: comm.all_reduce([1.0, 2.0], ReduceOp.SUM, async_op=False),
               lambda: comm.broadcast(None, 0, async_op=False),
               lambda: comm.all_gather(None, z(4), async_op=False),
               lambda: comm.all_gather([1.0], z(4), async_op=False),
               lambda: comm.all_reduce(z(4), "sum", async_op=False)):
        with pytest.raises(TypeError):
            fn()
    assert_usable(comm)


def test_errors_name_the_operation_and_argument(comm):
    with pytest.raises(ValueError) as e:
        comm.all_gather([z(3)], z(4), async_op=False)
    assert "all_gather" in str(e.value)
    with pytest.raises(ValueError) as e:
        comm.all_reduce(torch.zeros(2, 2).t(), ReduceOp.SUM, async_op=False)
    assert "all_reduce" in str(e.value) and "tensor" in str(e.value)


def _fresh(name):
    with pytest.MonkeyPatch.context() as mp:
        for k in LAUNCH_ENV:
            mp.delenv(k, raising=False)
        return torchcomms.new_comm("cpu", "cpu", name=name, timeout=timedelta(seconds=30))


def test_use_after_finalize_raises_runtime_error():
    c = _fresh("finalized")
    t = torch.ones(4)
    c.all_reduce(t, ReduceOp.SUM, async_op=False)
    c.finalize()
    c.finalize()  # twice is harmless
    # getters still work
    assert c.get_rank() == 0 and c.get_size() == 1 and c.get_name() == "finalized"
    ops = [
        lambda: c.all_reduce(torch.ones(4), ReduceOp.SUM, async_op=False),
        lambda: c.all_reduce(torch.ones(4), ReduceOp.SUM, async_op=True).wait(),
        lambda: c.broadcast(torch.ones(4), 0, async_op=False),
        lambda: c.barrier(async_op=False),
        lambda: c.all_gather_single(z(4), z(4), async_op=False),
        lambda: c.split([0], "after"),
    ]
    for fn in ops:
        with pytest.raises(RuntimeError):
            fn()

    def batch():
        b = c.batch_op_create()
        b.send(z(2), 0)
        b.recv(z(2), 0)
        b.issue(async_op=False)
    with pytest.raises(RuntimeError):
        batch()
    c.finalize()


def test_abort():
    c = _fresh("aborted")
    assert not c.is_aborted()
    c.abort()
    assert c.is_aborted()
    with pytest.raises(RuntimeError):
        c.all_reduce(torch.ones(4), ReduceOp.SUM, async_op=False)
    c.finalize()  # after abort: harmless


def test_async_work_holds_its_tensors():
    c = _fresh("lifetime")
    import gc
    works = [c.all_reduce(torch.full((1000,), 3.0), ReduceOp.SUM, async_op=True) for _ in range(10)]
    gc.collect()
    for w in works:
        w.wait()
        assert w.is_completed()
    c.finalize()


def test_works_after_error(comm):
    with pytest.raises(ValueError):
        comm.all_gather([z(3)], z(4), async_op=False)
    for _ in range(3):
        assert_usable(comm)
    outs = [z(4)]
    comm.all_gather(outs, torch.arange(4.0), async_op=False)
    assert torch.equal(outs[0], torch.arange(4.0))


def test_api_surface():
    """Names and types the contract lists (docs/python_api.md)."""
    import datetime
    import enum

    tc = torchcomms
    assert tc.Timeout is datetime.timedelta
    for cls, members in ((tc.RedOpType, "SUM PRODUCT MIN MAX BAND BOR BXOR PREMUL_SUM AVG"),
                         (tc.WorkStatus, "NOT_STARTED INPROGRESS COMPLETED TIMEDOUT ERROR"),
                         (tc.P2POpType, "SEND RECV")):
        assert issubclass(cls, enum.Enum), cls
        assert [m.name for m in cls] == members.split(), cls
    for name in "SUM PRODUCT MIN MAX BAND BOR BXOR AVG".split():
        op = getattr(ReduceOp, name)
        assert isinstance(op, ReduceOp)
        assert op.type == getattr(tc.RedOpType, name)
        assert op == getattr(ReduceOp, name) and name in repr(op)
    assert ReduceOp.SUM != ReduceOp.MAX
    p = ReduceOp.PREMUL_SUM(2.0)
    assert p.type == tc.RedOpType.PREMUL_SUM and "PREMUL_SUM" in repr(p)
    assert ReduceOp.PREMUL_SUM(torch.tensor([2.0])).type == tc.RedOpType.PREMUL_SUM
    with pytest.raises((TypeError, ValueError)):
        ReduceOp.PREMUL_SUM(torch.tensor([1.0, 2.0]))  # not one element
    with pytest.raises((TypeError, ValueError)):
        ReduceOp.PREMUL_SUM("x")
    for cls in ("SendOptions RecvOptions BatchP2POptions BroadcastOptions AllReduceOptions "
                "ReduceOptions AllGatherOptions AllGatherSingleOptions ReduceScatterOptions "
                "ReduceScatterSingleOptions AllToAllOptions AllToAllSingleOptions "
                "AllToAllvSingleOptions BarrierOptions ScatterOptions GatherOptions").split():
        o = getattr(tc, cls)()
        o.timeout = datetime.timedelta(seconds=3)
        o.hints = {"a": "b"}
        assert o.timeout == datetime.timedelta(seconds=3) and o.hints == {"a": "b"}, cls
    co = tc.CommOptions()
    for attr in ("abort_process_on_timeout_or_error", "timeout", "high_priority_stream",
                 "store", "enable_reconfigure", "hints"):
        assert hasattr(co, attr), attr
    t = torch.zeros(2)
    op = tc.P2POp(tc.P2POpType.SEND, t, 3)
    assert op.type == tc.P2POpType.SEND and op.tensor is t and op.peer == 3
    # torchcomms' _set_status exists; it accepts only works a Python
    # backend made (tests/py/compat/test_compat_contract.py checks the error)
    assert callable(tc.TorchWork._set_status)


def test_new_comm_arguments():
    """Keyword arguments of the contract, and upstream's newer positional
    name (new_comm(backend, device, name))."""
    with pytest.MonkeyPatch.context() as mp:
        for k in LAUNCH_ENV:
            mp.delenv(k, raising=False)
        c = torchcomms.new_comm("cpu", "cpu", "positional_name")
        assert c.get_name() == "positional_name"
        c.finalize()
        c = torchcomms.new_comm(backend="cpu", device=torch.device("cpu"), name="kw",
                                abort_process_on_timeout_or_error=False,
                                timeout=timedelta(seconds=42), enable_reconfigure=False,
                                hints={"x": "y"}, high_priority_stream=False)
        o = c.get_options()
        assert o.timeout == timedelta(seconds=42)
        assert o.abort_process_on_timeout_or_error is False
        assert o.hints.get("x") == "y", o.hints
        assert c.get_device() == torch.device("cpu") and c.get_backend() == "cpu"
        c.finalize()
        c = torchcomms.new_comm("cpu", "cpu")
        assert c.get_name() == "main"
        c.finalize()
        with pytest.raises(RuntimeError):
            torchcomms.new_comm("no_such_backend_xyz", "cpu", name="nb")


EXIT_WITHOUT_FINALIZE = """
import sys, torch, torchcomms
c = torchcomms.new_comm("cpu", "cpu", name="noexit")
t = torch.ones(1000)
c.all_reduce(t, torchcomms.ReduceOp.SUM, async_op=False)
assert t[0].item() == c.get_size(), t[0].item()
c.all_reduce(torch.ones(10), torchcomms.ReduceOp.SUM, async_op=True)  # never waited on
print("done", c.get_rank(), flush=True)
# no finalize: the interpreter's exit must neither hang nor crash
"""


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("size", [1])  # 2 ranks: test_store_variants.py::test_no_store_plain_env
def test_exit_without_finalize(size):
    port = _free_port()
    procs = []
    for r in range(size):
        env = clean_env()
        if size > 1:
            env.update(RANK=str(r), WORLD_SIZE=str(size), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, "-c", EXIT_WITHOUT_FINALIZE],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env))
    for r, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"rank {r} did not exit")
        assert p.returncode == 0, out + err
        assert f"done {r}" in out
