"""The torchcomms._comms extension's own behaviour: every TorchComm method at
world size 1 (in-process store, no launcher), every dtype, argument errors
(exception type and message), TorchWork lifetimes, the store adapter, GIL
release (2 processes) and multi-rank results under torchrun (2 and 4 ranks).

Run: make pyinstall && TC_BUILD_DIR=build .venv/bin/python -m pytest -q tests/py/test_comms_basic.py
"""
import gc
import importlib
import os
import socket
import subprocess
import sys
import weakref
from datetime import timedelta
from pathlib import Path

import pytest
import torch

import torchcomms
from torchcomms import ReduceOp, RedOpType, WorkStatus, P2POpType

HERE = Path(__file__).resolve().parent
TORCHRUN = Path(sys.executable).with_name("torchrun")
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
          torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool]
LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
              "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID",
              "TORCHCOMM_RANK", "TORCHCOMM_SIZE")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    env["OMP_NUM_THREADS"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_py(code, timeout=60, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=clean_env(**env))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def comm():
    c = torchcomms.new_comm("cpu", torch.device("cpu"), name="basic")
    yield c
    c.finalize()


def vals(dtype, n=6):
    return (torch.arange(n) % 4).to(dtype)


# ---------------------------------------------------------------------------
# import behaviour
# ---------------------------------------------------------------------------

def test_import_is_fast_and_does_not_touch_torch_distributed():
    code = ("import sys, time\n"
            "t = time.perf_counter()\n"
            "import torchcomms\n"
            "dt = time.perf_counter() - t\n"
            "bad = [m for m in ('torch', 'torch.distributed') if m in sys.modules]\n"
            "print(dt, bad)\n")
    best = None
    for _ in range(3):
        p = run_py(code)
        assert p.returncode == 0, p.stderr
        dt, bad = p.stdout.split(" ", 1)
        assert bad.strip() == "[]", f"import torchcomms imported {bad}"
        best = float(dt) if best is None else min(best, float(dt))
    assert best < 0.050, f"import torchcomms took {best * 1e3:.1f} ms"


def test_torch_distributed_imports_with_package_installed():
    p = run_py("import torch.distributed as dist\n"
               "from torch.distributed import distributed_c10d as c\n"
               "assert dist.is_available()\n"
               "print('ok', c._TORCHCOMM_AVAILABLE)\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("ok")


def test_missing_names_raise_import_error():
    with pytest.raises(ImportError):
        from torchcomms._comms import _NoSuchName  # noqa: F401
    if not (Path(torchcomms.__file__).parent / "hooks").exists() and \
            not (Path(torchcomms.__file__).parent / "hooks.py").exists():
        with pytest.raises(ImportError):
            importlib.import_module("torchcomms.hooks")
    with pytest.raises(AttributeError):
        torchcomms.no_such_name  # noqa: B018


def test_public_names_and_enums():
    import torchcomms._comms as C
    for name in C.__all__:
        assert getattr(torchcomms, name) is getattr(C, name)
    assert torchcomms.Timeout is timedelta
    assert [m.name for m in RedOpType] == ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR",
                                           "BXOR", "PREMUL_SUM", "AVG"]
    assert [m.value for m in RedOpType] == list(range(1, 10))
    assert [m.name for m in WorkStatus] == ["NOT_STARTED", "INPROGRESS", "COMPLETED",
                                            "TIMEDOUT", "ERROR"]
    assert [m.value for m in WorkStatus] == list(range(1, 6))
    assert [(m.name, m.value) for m in P2POpType] == [("SEND", 1), ("RECV", 2)]
    assert RedOpType.__module__ == "torchcomms._comms"
    assert torchcomms.__version__
    with pytest.raises(TypeError):
        torchcomms.TorchComm()
    with pytest.raises(TypeError):
        torchcomms.TorchWork()


def test_options_classes():
    o = torchcomms.CommOptions()
    assert o.timeout == timedelta(seconds=600) and o.hints == {} and o.store is None
    assert o.abort_process_on_timeout_or_error is False and o.enable_reconfigure is False
    for name in ("SendOptions", "RecvOptions", "BatchP2POptions", "BroadcastOptions",
                 "AllReduceOptions", "ReduceOptions", "AllGatherOptions",
                 "AllGatherSingleOptions", "ReduceScatterOptions",
                 "ReduceScatterSingleOptions", "AllToAllOptions", "AllToAllSingleOptions",
                 "AllToAllvSingleOptions", "BarrierOptions", "ScatterOptions",
                 "GatherOptions"):
        cls = getattr(torchcomms, name)
        x = cls()
        assert x.timeout == timedelta(0) and x.hints == {}
        x.timeout = timedelta(seconds=3)
        x.hints = {"a": "b"}
        assert cls.__module__ == "torchcomms._comms" and name in repr(x)
        with pytest.raises(AttributeError):
            x.other = 1


# ---------------------------------------------------------------------------
# ReduceOp, P2POp
# ---------------------------------------------------------------------------

def test_reduce_op():
    assert ReduceOp.SUM.type is RedOpType.SUM
    assert ReduceOp.AVG.type is RedOpType.AVG
    assert ReduceOp.SUM == ReduceOp.SUM and ReduceOp.SUM != ReduceOp.MAX
    assert repr(ReduceOp.BXOR) == "ReduceOp.BXOR"
    p = ReduceOp.PREMUL_SUM(0.5)
    assert p.type is RedOpType.PREMUL_SUM and repr(p) == "ReduceOp.PREMUL_SUM(0.5)"
    assert p == ReduceOp.PREMUL_SUM(torch.tensor([0.5])) == ReduceOp.PREMUL_SUM(torch.tensor(0.5))
    assert p != ReduceOp.PREMUL_SUM(2.0)
    assert len({ReduceOp.SUM, ReduceOp.SUM, p, ReduceOp.PREMUL_SUM(0.5)}) == 2
    assert ReduceOp(RedOpType.MAX) == ReduceOp.MAX
    with pytest.raises(ValueError, match="one-element tensor"):
        ReduceOp.PREMUL_SUM(torch.ones(2))
    with pytest.raises(TypeError, match="factor"):
        ReduceOp.PREMUL_SUM("x")
    with pytest.raises(ValueError, match="finite"):
        ReduceOp.PREMUL_SUM(float("inf"))
    with pytest.raises(ValueError, match="PREMUL_SUM"):
        ReduceOp(RedOpType.PREMUL_SUM)


def test_p2p_op():
    t = torch.ones(2)
    op = torchcomms.P2POp(P2POpType.SEND, t, 3)
    assert op.type is P2POpType.SEND and op.tensor is t and op.peer == 3
    op.peer = 1
    assert op.peer == 1 and "SEND" in repr(op)
    with pytest.raises(TypeError, match="P2POpType"):
        torchcomms.P2POp("send", t, 0)


# ---------------------------------------------------------------------------
# communicator methods at world size 1
# ---------------------------------------------------------------------------

def test_getters(comm):
    assert comm.get_rank() == 0 == comm.rank
    assert comm.get_size() == 1 == comm.size
    assert comm.get_name() == "basic" == comm.name
    assert comm.get_backend() == "cpu"
    assert isinstance(comm.get_backend_version(), str) and comm.get_backend_version()
    assert comm.get_device() == torch.device("cpu")
    assert not comm.is_aborted()
    r = repr(comm)
    assert "basic" in r and "rank=0" in r and "size=1" in r
    o = comm.get_options()
    assert isinstance(o, torchcomms.CommOptions)
    assert isinstance(o.timeout, timedelta) and o.timeout.total_seconds() > 0


def test_default_timeout_is_the_c_constant(monkeypatch):
    """One default timeout: the C library's TC_DEFAULT_TIMEOUT_S, exported by
    the extension, is CommOptions' default, a new communicator's and the
    README's."""
    from torchcomms import _comms as C
    secs = C.DEFAULT_TIMEOUT_SECONDS
    assert isinstance(secs, float) and secs > 0
    assert torchcomms.CommOptions().timeout == timedelta(seconds=secs)
    monkeypatch.delenv("TORCHCOMM_TIMEOUT_SECONDS", raising=False)
    c = torchcomms.new_comm("cpu", "cpu", name="dflt_timeout")
    assert c.get_options().timeout == timedelta(seconds=secs)
    c.finalize()
    readme = (HERE.parent.parent / "README.md").read_text()
    assert f"`TORCHCOMM_TIMEOUT_SECONDS`,\ndefault {secs:g} s" in readme


def test_classes_come_from_their_python_module():
    """The enums and option classes are written in torchcomms/_comms_classes.py
    (installed with the package) and exported by the extension as its own."""
    from torchcomms import _comms as C, _comms_classes as K
    assert Path(K.__file__).parent == Path(C.__file__).parent
    for name in K.__all__:
        assert getattr(C, name) is getattr(K, name)
    assert C.CommOptions.__module__ == "torchcomms._comms"


def test_new_comm_arguments():
    c = torchcomms.new_comm("cpu", "cpu", name="args", timeout=timedelta(seconds=42),
                            hints={"x": "y"}, abort_process_on_timeout_or_error=False,
                            high_priority_stream=True, enable_reconfigure=True)
    o = c.get_options()
    assert o.timeout == timedelta(seconds=42) and o.hints == {"x": "y"}
    assert o.high_priority_stream is True and o.enable_reconfigure is True
    assert o.abort_process_on_timeout_or_error is False
    assert c.get_device() == torch.device("cpu")
    c.set_timeout(timedelta(seconds=7))
    assert c.get_options().timeout == timedelta(seconds=7)
    c.set_timeout(3.5)
    assert c.get_options().timeout == timedelta(seconds=3.5)
    with pytest.raises(ValueError):
        c.set_timeout(0)
    with pytest.raises(TypeError):
        c.set_timeout("soon")
    with pytest.raises(TypeError):
        c.set_timeout(None)
    c.finalize()
    # upstream's positional name; a str device with an index
    c = torchcomms.new_comm("cpu", "cpu:0", "posname", timeout=5)
    assert c.get_name() == "posname" and c.get_device() == torch.device("cpu", 0)
    c.all_reduce(torch.ones(2))
    c.finalize()


@pytest.mark.parametrize("kwargs,exc,frag", [
    (dict(backend="no_such_backend", device="cpu"), RuntimeError, "no_such_backend"),
    (dict(backend=3, device="cpu"), TypeError, "'backend' must be a str"),
    (dict(backend="cpu", device=3), TypeError, "'device' must be a torch.device"),
    (dict(backend="cpu", device=":1"), ValueError, "is not a device"),
    (dict(backend="cpu", device="cpu", name=5), TypeError, "'name' must be a str"),
    (dict(backend="cpu", device="cpu", name="a/b"), ValueError, "name"),
    (dict(backend="cpu", device="cpu", timeout="x"), TypeError, "'timeout'"),
    (dict(backend="cpu", device="cpu", timeout=-1), ValueError, "'timeout'"),
    (dict(backend="cpu", device="cpu", hints=[1]), TypeError, "'hints' must be a dict"),
    (dict(backend="cpu", device="cpu", hints={"a": 1}), TypeError, "str to str"),
    (dict(backend="cpu", device="cpu", store=object()), TypeError, "torch.distributed.Store"),
    (dict(backend="cpu", device="cpu", abort_process_on_timeout_or_error=2.5), TypeError,
     "abort_process_on_timeout_or_error"),
    (dict(backend="cpu", device="cuda:0"), ValueError, "device 'cuda:0' is not served"),
    (dict(backend="cpu", device=torch.device("meta")), ValueError, "device 'meta' is not served"),
])
def test_new_comm_errors(kwargs, exc, frag):
    with pytest.raises(exc, match=frag):
        torchcomms.new_comm(**kwargs)


def check_all_ops(comm, dtype, a):
    """Every operation at world size 1 (results are the inputs, or reduced
    with themselves only)."""
    def done(w):
        assert isinstance(w, torchcomms.TorchWork)
        w.wait()
        with pytest.raises(RuntimeError, match="waitBlocking not implemented"):
            w.wait_blocking()  # torchcomms: no fault tolerance here
        assert w.is_completed() and w.status() is WorkStatus.COMPLETED

    ops = [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX]
    if dtype != torch.bool:
        ops.append(ReduceOp.AVG)
    if not dtype.is_floating_point:
        ops += [ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR]
    for op in ops:
        t = vals(dtype)
        done(comm.all_reduce(t, op, a))
        assert torch.equal(t, vals(dtype)), op
        t = vals(dtype)
        done(comm.reduce(t, 0, op, a))
        assert torch.equal(t, vals(dtype)), op
    if dtype.is_floating_point:
        t = vals(dtype)
        done(comm.all_reduce(t, ReduceOp.PREMUL_SUM(3.0), a))
        assert torch.equal(t, vals(dtype) * 3)
    t = vals(dtype)
    done(comm.broadcast(t, 0, a))
    assert torch.equal(t, vals(dtype))
    out = [torch.zeros(6, dtype=dtype)]
    done(comm.all_gather(out, vals(dtype), a))
    assert torch.equal(out[0], vals(dtype))
    out = [torch.zeros(6, dtype=dtype)]
    done(comm.all_gather_v(out, vals(dtype), a))
    assert torch.equal(out[0], vals(dtype))
    out = torch.zeros(6, dtype=dtype)
    done(comm.all_gather_single(out, vals(dtype), a))
    assert torch.equal(out, vals(dtype))
    out = torch.zeros(6, dtype=dtype)
    done(comm.reduce_scatter(out, [vals(dtype)], ReduceOp.SUM, a))
    assert torch.equal(out, vals(dtype))
    out = torch.zeros(6, dtype=dtype)
    done(comm.reduce_scatter_v(out, [vals(dtype)], ReduceOp.MAX, a))
    assert torch.equal(out, vals(dtype))
    out = torch.zeros(6, dtype=dtype)
    done(comm.reduce_scatter_single(out, vals(dtype), ReduceOp.SUM, a))
    assert torch.equal(out, vals(dtype))
    out = torch.zeros(6, dtype=dtype)
    done(comm.all_to_all_single(out, vals(dtype), a))
    assert torch.equal(out, vals(dtype))
    out = torch.zeros(3, 2, dtype=dtype)
    done(comm.all_to_all_v_single(out, vals(dtype).reshape(3, 2), [3], [3], a))
    assert torch.equal(out, vals(dtype).reshape(3, 2))
    out = [torch.zeros(6, dtype=dtype)]
    done(comm.all_to_all(out, [vals(dtype)], a))
    assert torch.equal(out[0], vals(dtype))
    done(comm.barrier(a))
    out = torch.zeros(6, dtype=dtype)
    done(comm.scatter(out, [vals(dtype)], 0, a))
    assert torch.equal(out, vals(dtype))
    out = [torch.zeros(6, dtype=dtype)]
    done(comm.gather(out, vals(dtype), 0, a))
    assert torch.equal(out[0], vals(dtype))
    out = torch.zeros(6, dtype=dtype)
    done(comm.gather_single(out, vals(dtype), 0, a))
    assert torch.equal(out, vals(dtype))
    # batch: self send and receive
    b = comm.batch_op_create()
    out = torch.zeros(6, dtype=dtype)
    b.send(vals(dtype), 0)
    b.recv(out, 0)
    assert [o.type for o in b.ops] == [P2POpType.SEND, P2POpType.RECV]
    done(b.issue(a))
    assert torch.equal(out, vals(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_every_op_every_dtype(comm, dtype, async_op):
    check_all_ops(comm, dtype, async_op)


def test_keywords_aliases_and_empty_tensors(comm):
    t = torch.ones(4)
    w = comm.all_reduce(tensor=t, op=ReduceOp.SUM, async_op=True, hints={"h": "v"},
                        timeout=timedelta(seconds=10))
    w.wait()
    comm.all_reduce(t, timeout=2.5)  # default op SUM, seconds as a number
    comm.allreduce(t, ReduceOp.SUM)
    comm.allgather([torch.zeros(4)], t)
    comm.allgather_single(torch.zeros(4), t)
    comm.reducescatter(torch.zeros(4), [t])
    comm.reducescatter_single(torch.zeros(4), t)
    comm.alltoall_single(torch.zeros(4), t)
    comm.alltoall([torch.zeros(4)], [t])
    comm.alltoallv_single(torch.zeros(4, 1), t.reshape(4, 1), [], [])
    comm.all_reduce(torch.zeros(0))
    comm.all_gather_single(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
    comm.broadcast(torch.tensor(5.0), 0)  # 0-dim
    # requires_grad tensors work (DDP broadcasts parameters)
    p = torch.nn.Parameter(torch.ones(3))
    comm.broadcast(p, 0)
    comm.all_reduce(p.detach())
    # a TorchWork of a synchronous op is already completed
    w = comm.barrier()
    assert w.is_completed() and w.status() is WorkStatus.COMPLETED and "completed" in repr(w)


def test_batch_issue_options(comm):
    b = comm.batch_op_create()
    out = torch.zeros(3, dtype=torch.int32)
    b.send(torch.arange(3, dtype=torch.int32), dst=0)
    b.recv(out, src=0)
    opts = torchcomms.BatchP2POptions()
    opts.timeout = timedelta(seconds=30)
    opts.hints = {"a": "b"}
    b.issue(False, opts)
    assert out.tolist() == [0, 1, 2]
    out.zero_()
    b.issue(async_op=True).wait()  # a batch may be issued again
    assert out.tolist() == [0, 1, 2]
    b.ops = [torchcomms.P2POp(P2POpType.SEND, torch.ones(1), 0)]
    with pytest.raises(ValueError, match="no matching self recv"):
        b.issue(False)
    b.ops = ["x"]
    with pytest.raises(TypeError, match="must be a P2POp"):
        b.issue(False)
    e = comm.batch_op_create()
    e.issue(False)  # an empty batch


def test_split(comm):
    sub = comm.split([0], "sub")
    assert isinstance(sub, torchcomms.TorchComm)
    assert sub.get_name() == "sub" and sub.get_size() == 1 and sub.get_rank() == 0
    t = torch.ones(2)
    sub.all_reduce(t)
    sub.finalize()
    assert comm.split([], "none") is None
    # torchcomms raises RuntimeError for every refused list
    with pytest.raises(RuntimeError, match=r"ranks\[0\] = 1 is out of range"):
        comm.split([1], "bad")
    with pytest.raises(RuntimeError, match="rank 0 appears twice in 'ranks'"):
        comm.split([0, 0], "bad")
    with pytest.raises(TypeError, match="'ranks' must be a list"):
        comm.split(0, "bad")
    with pytest.raises(TypeError, match="'name' must be a str"):
        comm.split([0], 3)


# ---------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------

T = torch.ones(4)


@pytest.mark.parametrize("call,exc,frag", [
    (lambda c: c.all_reduce([1, 2]), TypeError,
     "all_reduce: argument 'tensor' must be a torch.Tensor"),
    (lambda c: c.broadcast(None, 0), TypeError, "broadcast: argument 'tensor' must be a torch.Tensor"),
    (lambda c: c.all_reduce(torch.ones(4, 2)[:, 0]), ValueError,
     "all_reduce: argument 'tensor' must be contiguous"),
    (lambda c: c.all_reduce(torch._neg_view(torch.ones(3))), ValueError,
     "all_reduce: argument 'tensor' is a negative view"),
    (lambda c: c.all_reduce(torch.ones(2, dtype=torch.complex64).conj()), TypeError,
     "all_reduce: argument 'tensor' has dtype torch.complex64"),
    (lambda c: c.all_reduce(torch.ones(2, device="meta")), ValueError,
     "all_reduce: argument 'tensor' is on device 'meta'"),
    (lambda c: c.all_reduce(torch.ones(2, dtype=torch.uint16)), TypeError,
     "does not support"),
    (lambda c: c.all_reduce(torch.ones(2), ReduceOp.BAND), TypeError,
     "all_reduce: reduction BAND .argument 'op'. is not defined for dtype float32"),
    (lambda c: c.reduce_scatter_single(torch.ones(1), torch.ones(1), ReduceOp.BXOR), TypeError,
     "reduce_scatter_single: reduction BXOR"),
    (lambda c: c.all_reduce(torch.ones(2, dtype=torch.int32), ReduceOp.PREMUL_SUM(2.0)),
     TypeError, "PREMUL_SUM"),
    (lambda c: c.all_reduce(torch.ones(2, dtype=torch.bool), ReduceOp.AVG), TypeError, "AVG"),
    (lambda c: c.all_reduce(T, "sum"), TypeError, "all_reduce: argument 'op' must be"),
    (lambda c: c.all_reduce(T, hints=["a"]), TypeError, "all_reduce: argument 'hints'"),
    (lambda c: c.all_reduce(T, hints={"a": 1}), TypeError, "str to str"),
    (lambda c: c.all_reduce(T, timeout="1s"), TypeError, "all_reduce: argument 'timeout'"),
    (lambda c: c.all_reduce(T, timeout=-1.0), ValueError, "all_reduce: argument 'timeout'"),
    (lambda c: c.broadcast(T, 5), ValueError, "argument 'root' = 5 is out of range"),
    (lambda c: c.broadcast(T, 2**40), ValueError, "broadcast: argument 'root'"),
    (lambda c: c.broadcast(T, "0"), TypeError, "broadcast: argument 'root' must be an int"),
    (lambda c: c.reduce(T, -1), ValueError, "'root' = -1 is out of range"),
    (lambda c: c.send(T, 0), ValueError, "caller's own rank"),
    (lambda c: c.recv(T, 1), ValueError, "'peer' = 1 is out of range"),
    (lambda c: c.all_gather([T, T], T), ValueError,
     "all_gather: argument 'tensor_list' has 2 tensors but the communicator has 1 ranks"),
    (lambda c: c.all_gather(T, T), TypeError, "'tensor_list' must be a list of tensors"),
    (lambda c: c.all_gather([torch.ones(3)], T), ValueError,
     r"all_gather: argument 'tensor_list\[0\]' has 3 elements"),
    (lambda c: c.all_gather([torch.ones(4, dtype=torch.int32)], T), ValueError,
     "all_gather: argument 'tensor_list' has dtype int32 but argument 'tensor' has dtype float32"),
    (lambda c: c.all_gather([1], T), TypeError,
     r"all_gather: argument 'tensor_list\[0\]' must be a torch.Tensor"),
    (lambda c: c.all_gather_v([torch.ones(2)], T), ValueError, "all_gather_v"),
    (lambda c: c.all_gather_single(torch.ones(5), T), ValueError,
     "all_gather_single: argument 'output' has 5 elements"),
    (lambda c: c.all_gather_single(torch.ones(4, dtype=torch.int64), T), ValueError,
     "all_gather_single: argument 'output' has dtype int64"),
    (lambda c: c.reduce_scatter(torch.ones(2), [T]), ValueError,
     r"reduce_scatter: argument 'input_list\[0\]' has 4 elements"),
    (lambda c: c.reduce_scatter_v(torch.ones(2), [T]), ValueError, "reduce_scatter_v"),
    (lambda c: c.reduce_scatter_single(torch.ones(2), T), ValueError,
     "reduce_scatter_single: argument 'input' has 4 elements"),
    (lambda c: c.all_to_all_single(torch.ones(3), T), ValueError,
     "all_to_all_single: argument 'output' has 3 elements"),
    (lambda c: c.all_to_all_v_single(torch.ones(4), T, [3], [4]), ValueError,
     "all_to_all_v_single: argument 'output_split_sizes' sums to 3 rows"),
    (lambda c: c.all_to_all_v_single(torch.ones(4), T, [4, 0], [4]), ValueError,
     "'output_split_sizes' has 2 entries"),
    (lambda c: c.all_to_all_v_single(torch.ones(4), T, [4], [-4]), ValueError,
     r"'input_split_sizes\[0\]' must be a non-negative int"),
    (lambda c: c.all_to_all_v_single(torch.ones(4, 2), torch.ones(8, 1), [4], [8]), ValueError,
     "dims after the first must match"),
    (lambda c: c.all_to_all_v_single(torch.tensor(1.0), torch.tensor(1.0), [1], [1]), ValueError,
     "at least one dimension"),
    (lambda c: c.all_to_all([T], [torch.ones(4, dtype=torch.int8)]), ValueError,
     "all_to_all: argument 'output_tensor_list' has dtype float32"),
    (lambda c: c.scatter(T, [torch.ones(3)], 0), ValueError,
     r"scatter: argument 'input_tensor_list\[0\]' has 3 elements"),
    (lambda c: c.gather([], T, 0), ValueError, "gather: argument 'output_tensor_list' has 0"),
    (lambda c: c.gather_single(torch.ones(3), T, 0), ValueError,
     "gather_single: argument 'output' has 3 elements"),
    (lambda c: c.barrier(hints={1: "x"}), TypeError, "barrier: argument 'hints'"),
    (lambda c: c.all_reduce(), TypeError, "tensor"),
])
def test_argument_errors(comm, call, exc, frag):
    with pytest.raises(exc, match=frag):
        call(comm)
    # the communicator is still usable afterwards
    t = torch.ones(2)
    comm.all_reduce(t)
    assert t.tolist() == [1.0, 1.0]


def test_finalize_and_abort():
    c = torchcomms.new_comm("cpu", "cpu", name="fin")
    c.all_reduce(torch.ones(2))
    c.finalize()
    c.finalize()  # twice is harmless
    for call in (lambda: c.all_reduce(torch.ones(2)), lambda: c.barrier(async_op=True),
                 lambda: c.batch_op_create().issue(False), lambda: c.split([0], "x")):
        with pytest.raises(RuntimeError, match="finalized"):
            call()
    assert c.get_rank() == 0 and c.get_name() == "fin"  # getters still work

    c = torchcomms.new_comm("cpu", "cpu", name="abt")
    c.abort()
    assert c.is_aborted()
    c.abort()
    with pytest.raises(RuntimeError, match="aborted"):
        c.all_reduce(torch.ones(2))
    assert "aborted" in repr(c)
    c.finalize()  # after abort: harmless

    c = torchcomms.new_comm("cpu", "cpu", name="dropped")
    w = c.all_reduce(torch.ones(8), async_op=True)
    del c  # dealloc without finalize aborts; the work stays valid
    gc.collect()
    assert w.is_completed()


def test_async_lifetime_world1(monkeypatch):
    # An operation certainly in flight: the loopback example backend holds it
    # on its progress thread for the hinted delay (the cpu backend finishes
    # one rank's operation at once, so "still in flight" would be a race).
    build = Path(os.environ.get("TC_BUILD_DIR", Path(__file__).resolve().parents[2] / "build"))
    monkeypatch.setenv("TORCHCOMMS_BACKEND_LIB_PATH_LOOPBACK", str(build.resolve() / "plugins"))
    lb = torchcomms.new_comm("loopback", "cpu", name="life-lb")
    t = torch.full((1 << 14,), 2.0)
    ref = weakref.ref(t)
    lb.all_reduce(t, ReduceOp.SUM, async_op=True,
                  hints={"loopback.delay_ms": "600000"})  # work dropped at once
    del t
    gc.collect()
    assert ref() is not None  # held by the communicator's pending list
    lb.abort()  # fails it at once
    del lb
    gc.collect()
    assert ref() is None
    # on the cpu backend's progress thread (world size 1 otherwise runs
    # operations on the caller's thread, complete before the call returns)
    monkeypatch.setenv("TORCHCOMMS_CPU_INLINE_BYTES", "0")
    c = torchcomms.new_comm("cpu", "cpu", name="life")
    ts = [torch.ones(256) for _ in range(200)]
    refs = [weakref.ref(x) for x in ts]
    for x in ts:
        c.all_reduce(x, async_op=True)
    works = [c.barrier(async_op=True) for _ in range(10)]
    del ts, x
    gc.collect()
    c.finalize()
    gc.collect()
    assert all(r() is None for r in refs)
    for w in works:
        w.wait()
        assert w.status() is WorkStatus.COMPLETED
    # a kept work with its tensor gone still reports
    c = torchcomms.new_comm("cpu", "cpu", name="life2")
    t = torch.ones(4)
    w = c.all_reduce(t, async_op=True)
    del t
    gc.collect()
    w.wait()
    assert w.is_completed()
    c.finalize()


def test_store_objects_world1():
    import torch.distributed as dist
    for store in (dist.HashStore(), dist.PrefixStore("p", dist.HashStore())):
        c = torchcomms.new_comm("cpu", "cpu", store=store, name="st")
        assert c.get_options().store is store
        t = torch.ones(3)
        c.all_reduce(t)
        sub = c.split([0], "st_sub")
        assert sub.get_options().store is store
        sub.finalize()
        c.finalize()


class DictStore:
    """A duck-typed store (the adapter needs only these methods)."""

    def __init__(self, wait_exc=TimeoutError):
        self.d, self.wait_exc = {}, wait_exc

    def set(self, k, v):
        self.d[k] = v if isinstance(v, bytes) else v.encode()

    def get(self, k):
        return self.d[k]

    def wait(self, keys, timeout):
        if not all(k in self.d for k in keys):
            raise self.wait_exc(f"wait timeout after {timeout}")

    def add(self, k, d):
        self.d[k] = str(int(self.d.get(k, b"0")) + d).encode()
        return int(self.d[k])

    def check(self, keys):
        return all(k in self.d for k in keys)

    def delete_key(self, k):
        return self.d.pop(k, None) is not None


class BoomStore(DictStore):
    def set(self, k, v):
        raise KeyError("boom " + k)

    def add(self, k, d):
        return "not an int"


def torch_stores(tmp_path):
    import torch.distributed as dist
    tcp = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=10))
    return {"hash": dist.HashStore(), "tcp": tcp,
            "file": dist.FileStore(str(tmp_path / "fs"), 1),
            "prefix": dist.PrefixStore("pre", dist.HashStore()), "duck": DictStore()}


@pytest.mark.parametrize("kind", ["hash", "tcp", "file", "prefix", "duck"])
def test_store_adapter_roundtrip(kind, tmp_path):
    """The C store API over a Python store: what C writes Python reads back
    and vice versa."""
    from torchcomms._comms import _store_call
    s = torch_stores(tmp_path)[kind]
    _store_call(s, "set", "k", b"\x00v1")
    assert s.get("k") == b"\x00v1"
    s.set("k2", "hello")
    assert _store_call(s, "get", "k2") == b"hello"
    assert _store_call(s, "add", "n", 5) == 5 and _store_call(s, "add", "n", -2) == 3
    assert s.add("n", 0) == 3
    assert _store_call(s, "check", ["k", "k2"]) is True
    assert _store_call(s, "check", ["k", "absent"]) is False
    _store_call(s, "wait", ["k", "k2"], None, 5.0)
    with pytest.raises(RuntimeError, match="TC_ERR_TIMEOUT"):
        _store_call(s, "wait", ["absent"], None, 0.2)
    with pytest.raises(RuntimeError, match="TC_ERR_TIMEOUT"):
        _store_call(s, "get", "absent", None, 0.0)
    if kind != "file":  # FileStore cannot delete
        assert _store_call(s, "delete", "k") is True
        assert _store_call(s, "check", ["k"]) is False


def test_store_adapter_exceptions():
    from torchcomms._comms import _store_call
    with pytest.raises(RuntimeError, match=r"TC_ERR_STORE: .*set\('k'\).*KeyError: 'boom k'"):
        _store_call(BoomStore(), "set", "k", b"v")
    with pytest.raises(RuntimeError, match="TC_ERR_STORE: .*add"):
        _store_call(BoomStore(), "add", "k", 1)
    class BadWait(DictStore):
        def wait(self, keys, timeout):
            raise ValueError("bad keys")
    with pytest.raises(RuntimeError, match="TC_ERR_STORE: .*ValueError: bad keys"):
        _store_call(BadWait(), "get", "absent", None, 0.5)
    class Lying(DictStore):
        def check(self, keys):
            return True
    with pytest.raises(RuntimeError, match=r"TC_ERR_STORE: .*get\('absent'\).*KeyError"):
        _store_call(Lying(), "get", "absent", None, 0.0)

    with pytest.raises(RuntimeError, match="TC_ERR_TIMEOUT: .*TimeoutError: wait timeout"):
        _store_call(DictStore(), "get", "absent", None, 0.5)
    with pytest.raises(RuntimeError, match="TC_ERR_TIMEOUT: .*wait timeout"):
        _store_call(DictStore(wait_exc=RuntimeError), "wait", ["absent"], None, 0.5)
    with pytest.raises(TypeError, match="torch.distributed.Store .object has no method 'set'"):
        _store_call(object(), "set", "k", b"v")


STORE_FAIL = r"""
import datetime, sys, torchcomms
sys.path.insert(0, {HERE!r})
from test_comms_basic import DictStore, BoomStore
try:
    torchcomms.new_comm("cpu", "cpu", store={STORE}, timeout=datetime.timedelta(seconds=2))
except Exception as e:
    print(type(e).__name__, "|", e)
    sys.exit(0)
print("created?!")
sys.exit(1)
"""


@pytest.mark.parametrize("rank,store,frags", [
    (0, "BoomStore()", ["RuntimeError |", "store"]),
    (1, "DictStore()", ["RuntimeError |", "timed out"]),
    (1, "DictStore(wait_exc=RuntimeError)", ["RuntimeError |", "timed out"]),
])
def test_new_comm_store_failures(rank, store, frags):
    """One rank of 2 whose peer never comes: failures inside the Python store
    end new_comm with a RuntimeError (a timeout in wait is a timeout)."""
    code = STORE_FAIL.replace("{STORE}", store).replace("{HERE!r}", repr(str(HERE)))
    p = run_py(code, timeout=60, TORCHCOMM_RANK=rank, TORCHCOMM_SIZE=2)
    assert p.returncode == 0, p.stdout + p.stderr
    for f in frags:
        assert f in p.stdout, p.stdout


# ---------------------------------------------------------------------------
# multiple processes
# ---------------------------------------------------------------------------

def test_gil_released_while_blocking(tmp_path):
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(HERE / "comms_gil.py"), str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=clean_env(TORCHCOMM_RANK=r, TORCHCOMM_SIZE=2,
                                            MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
             for r in range(2)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=120)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outs)
    assert "GIL OK" in outs[0], outs[0]


@pytest.mark.parametrize("n", [2, 4])
def test_multirank_torchrun(n, tmp_path):
    p = subprocess.run([str(TORCHRUN), "--standalone", f"--nproc_per_node={n}",
                        str(HERE / "comms_multirank.py"), "--filestore",
                        str(tmp_path / "filestore")],
                       capture_output=True, text=True, timeout=300, env=clean_env())
    assert p.returncode == 0, p.stdout + p.stderr
    for r in range(n):
        assert f"[rank {r}] OK" in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("var,value,frag", [
    ("TORCHCOMM_TIMEOUT_SECONDS", "abc", "expected a number > 0"),
    ("TORCHCOMM_TIMEOUT_SECONDS", "nan", "expected a number > 0"),
    ("TORCHCOMM_TIMEOUT_SECONDS", "-5", "expected a number > 0"),
    ("TORCHCOMMS_CPU_TRANSPORT", "bogus", "expected one of auto|shm|tcp"),
])
def test_bad_settings_are_errors(var, value, frag):
    """A bad value of a setting is an error naming it, not the default."""
    code = ("import torchcomms\n"
            "try:\n"
            "    torchcomms.new_comm('cpu', 'cpu', name='bad')\n"
            "except ValueError as e:\n"
            "    print('ERR', e)\n")
    p = run_py(code, **{var: value, "TORCHCOMM_RANK": 0, "TORCHCOMM_SIZE": 1})
    assert p.returncode == 0, p.stderr
    assert f"ERR torchcomms: tc_comm_create: {var}='{value}' is not valid" in p.stdout, p.stdout
    assert frag in p.stdout

