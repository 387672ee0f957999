"""The per-operation path of the extension (issue 16, point 6): METH_FASTCALL
argument binding (tcpy_parse) and the tensor reads (torch's C shim functions,
else its DLPack C exchange table, for torch.Tensor / nn.Parameter; the
accessor descriptors' C functions for other tensor types). Each case compares
with what the generic path (attribute lookups) must give: exact values at 1
rank, the same errors."""
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import torchcomms
import torchcomms._comms as _comms
from torchcomms import ReduceOp

HERE = pathlib.Path(__file__).resolve().parent
# the torch releases whose THPVariable layout the shim reading was checked on
SHIM_TORCH = torch.__version__.startswith("2.13.")


@pytest.fixture(scope="module")
def comm():
    c = torchcomms.new_comm("cpu", torch.device("cpu"), name="fastpath")
    yield c
    c.finalize()


def test_keywords_and_positions(comm):
    x = torch.arange(4.0)
    assert comm.all_reduce(x, ReduceOp.SUM, False) is not None
    comm.all_reduce(tensor=x, op=ReduceOp.MAX, async_op=True).wait()
    kw = {"async_op": False, "hints": None, "timeout": None}
    comm.all_reduce(x, **kw)
    out = torch.full((4,), -1.0)
    comm.all_gather_single(input=x, output=out)
    assert torch.equal(out, x)
    comm.reduce(x, 0, op=ReduceOp.SUM)
    assert torch.equal(x, torch.arange(4.0))


@pytest.mark.parametrize("call,frag", [
    (lambda c: c.all_reduce(), r"all_reduce\(\) missing required argument 'tensor' \(pos 1\)"),
    (lambda c: c.broadcast(torch.ones(1)), r"broadcast\(\) missing required argument 'root' \(pos 2\)"),
    (lambda c: c.all_reduce(torch.ones(1), tensor=torch.ones(1)),
     r"argument for all_reduce\(\) given by name \('tensor'\) and position \(1\)"),
    (lambda c: c.all_reduce(torch.ones(1), bogus=1), r"'bogus' is an invalid keyword argument for all_reduce\(\)"),
    (lambda c: c.all_reduce(torch.ones(1), None, False, None, None, 1),
     r"all_reduce\(\) takes at most 5 arguments \(6 given\)"),
    (lambda c: c.barrier(1, 2, 3, 4), r"barrier\(\) takes at most 3 arguments \(4 given\)"),
    (lambda c: c.batch_op_create().issue(x=1), r"'x' is an invalid keyword argument for issue\(\)"),
])
def test_argument_errors(comm, call, frag):
    with pytest.raises(TypeError, match=frag):
        call(comm)


def test_keyword_by_value_not_identity(comm):
    # a keyword name built at run time is not the interned one
    name = "".join(["ten", "sor"])
    x = torch.ones(3)
    comm.all_reduce(**{name: x})
    assert torch.equal(x, torch.ones(3))


class Sub(torch.Tensor):
    pass


class OverridesDataPtr(torch.Tensor):
    def data_ptr(self):  # not the tensor's memory: must be what we read
        raise RuntimeError("OverridesDataPtr.data_ptr called")


@pytest.mark.parametrize("make", [
    lambda: torch.arange(6, dtype=torch.int32),
    lambda: torch.nn.Parameter(torch.arange(6.0), requires_grad=False),
    lambda: torch.arange(6.0).as_subclass(Sub),
    lambda: torch.arange(12.0).view(2, 6)[1],          # offset view, contiguous
    lambda: torch.arange(6.0).view(1, 6, 1),            # size-1 dims
    lambda: torch.arange(6.0, requires_grad=True).detach(),
])
def test_reads_the_right_memory(comm, make):
    t = make()
    out = torch.full((t.numel(),), -7, dtype=t.dtype)
    comm.all_gather_single(out, t)
    assert torch.equal(out, t.reshape(-1))
    t2 = make()
    comm.broadcast(t2, 0)
    assert torch.equal(t2, make())


def test_subclass_override_is_honoured(comm):
    t = torch.ones(3).as_subclass(OverridesDataPtr)
    with pytest.raises(RuntimeError, match="OverridesDataPtr.data_ptr called"):
        comm.all_reduce(t)


def test_empty_and_zero_dim(comm):
    e = torch.empty(0)
    comm.all_reduce(e)
    z = torch.tensor(5.0)
    comm.all_reduce(z)
    assert z.item() == 5.0


@pytest.mark.parametrize("make,exc,frag", [
    (lambda: torch.ones(1).expand(4), ValueError, "must be contiguous"),
    (lambda: torch.arange(6.0).view(2, 3).t(), ValueError, "must be contiguous"),
    (lambda: torch._neg_view(torch.ones(3, dtype=torch.int32)), ValueError, "negative view"),
    (lambda: torch.ones(2, dtype=torch.complex64).conj(), TypeError, "complex64"),
    (lambda: torch.ones(2, dtype=torch.uint16), TypeError, "does not support"),
    (lambda: torch.ones(2, device="meta"), ValueError, "is on device 'meta'"),
    (lambda: torch.ones(2, 2).to_sparse(), ValueError, "must be contiguous|has no storage|sparse|layout"),
])
def test_refusals_keep_their_words(comm, make, exc, frag):
    t = make()
    with pytest.raises((exc, RuntimeError), match=frag) as ei:
        comm.all_reduce(t)
    if "sparse" not in repr(t.layout):
        assert ei.type is exc


def test_metadata_changed_between_calls(comm):
    # every call reads the tensor afresh (only "no negative view" is
    # remembered, with the address, count and dtype it was seen with):
    # .data = and storage resizes are seen
    x = torch.arange(4.0)
    comm.all_reduce(x)
    x.data = torch.arange(6.0).view(2, 3).t()
    with pytest.raises(ValueError, match="must be contiguous"):
        comm.all_reduce(x)
    x.data = torch._neg_view(torch.ones(4))
    with pytest.raises(ValueError, match="negative view"):
        comm.all_reduce(x)
    x.data = torch.arange(8, dtype=torch.int64)
    out = torch.zeros(8, dtype=torch.int64)
    comm.all_gather_single(out, x)
    assert torch.equal(out, torch.arange(8))
    y = torch.arange(3.0)
    y.untyped_storage().resize_(0)
    with pytest.raises((RuntimeError, ValueError)):
        comm.all_reduce(y)


def test_negative_view_memo_follows_the_tensor(comm):
    # a tensor seen to be no negative view is not asked again while its
    # address, element count and dtype stay; a change of any of them, or
    # another object, is asked again (_comms_tensor.c, tcpy_notneg_*)
    base = torch.ones(8)
    x = base[:4]
    comm.all_reduce(x)
    comm.all_reduce(x)
    # the same address, another count: asked again
    x.data = torch._neg_view(base)
    with pytest.raises(ValueError, match="negative view"):
        comm.all_reduce(x)
    # another address, the same count
    x.data = torch._neg_view(torch.ones(4))
    with pytest.raises(ValueError, match="negative view"):
        comm.all_reduce(x)
    # the same address and count, another dtype
    y = torch.zeros(4, dtype=torch.int32)
    comm.all_reduce(y)
    y.data = torch._neg_view(y.view(torch.float32))
    with pytest.raises(ValueError, match="negative view"):
        comm.all_reduce(y)
    # a new object over the memory another one was remembered with
    z = torch.arange(4.0)
    comm.all_reduce(z)
    with pytest.raises(ValueError, match="negative view"):
        comm.all_reduce(torch._neg_view(z))
    with pytest.raises(ValueError, match="negative view"):
        comm.all_gather_single(torch.zeros(4), torch._neg_view(z))
    assert torch.equal(z, torch.arange(4.0))


def test_negative_view_memo_more_tensors_than_entries(comm):
    # more tensors in turn than the table holds: each is still read right
    # (entries are replaced in turn), and a negative view among them is
    # refused whichever entry it would take
    ts = [torch.full((3,), float(i)) for i in range(20)]
    for _ in range(3):
        for i, t in enumerate(ts):
            comm.all_reduce(t)
            assert torch.equal(t, torch.full((3,), float(i)))
    for k in range(20):
        with pytest.raises(ValueError, match="negative view"):
            comm.all_reduce(torch._neg_view(ts[k]))
    out = torch.zeros(3)
    for i, t in enumerate(ts):
        comm.all_gather_single(out, t)
        assert torch.equal(out, t)


def test_negative_view_memo_forgets_dead_tensors(comm):
    # the table holds weak references: a tensor it remembers is freed with
    # its last reference, and a negative view made after it is refused
    import gc
    import weakref
    t = torch.ones(5)
    comm.all_reduce(t)
    r = weakref.ref(t)
    del t
    gc.collect()
    assert r() is None
    for _ in range(50):  # new objects, some perhaps at the freed address
        n = torch._neg_view(torch.ones(5))
        with pytest.raises(ValueError, match="negative view"):
            comm.all_reduce(n)
        del n


def test_monkeypatched_tensor_method_is_seen(comm, monkeypatch):
    x = torch.ones(3)
    comm.all_reduce(x)  # the fast path is in use for torch.Tensor

    def boom(self):
        raise RuntimeError("patched is_contiguous")

    monkeypatch.setattr(torch.Tensor, "is_contiguous", boom)
    with pytest.raises(RuntimeError, match="patched is_contiguous"):
        comm.all_reduce(x)
    monkeypatch.undo()
    comm.all_reduce(x)


def test_batch_kept_between_issues_follows_every_change(comm):
    # BatchSendRecv keeps its C batch between issues while no op changes: an
    # issue re-reads every tensor, so new contents, a new tensor, new storage,
    # a new peer and more ops are all seen (1 rank: sends to itself)
    b = comm.batch_op_create()
    x, y = torch.arange(4.0), torch.zeros(4)
    b.send(x, 0)
    b.recv(y, 0)
    b.issue()
    assert torch.equal(y, torch.arange(4.0))
    x.add_(10)                                   # same memory, new contents
    b.issue()
    assert torch.equal(y, torch.arange(4.0) + 10)
    z = torch.zeros(4)
    b.ops[1].tensor = z                          # another tensor
    x.add_(1)
    b.issue()
    assert torch.equal(z, torch.arange(4.0) + 11) and torch.equal(y, torch.arange(4.0) + 10)
    z.set_(torch.zeros(4))                       # same tensor object, new storage
    b.issue()
    assert torch.equal(z, torch.arange(4.0) + 11)
    x2, y2 = torch.ones(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)
    b.send(x2, 0)                                # more ops
    b.recv(y2, 0)
    b.issue()
    assert torch.equal(y2, torch.ones(2, dtype=torch.int64))
    b.ops[0].peer = 5                            # a bad peer is refused, not reused
    with pytest.raises(ValueError, match="peer"):
        b.issue()
    b.ops[0].peer = 0
    works = [b.issue(async_op=True) for _ in range(3)]
    for w in works:
        w.wait()
    assert torch.equal(z, torch.arange(4.0) + 11)


def test_torch_tensors_are_read_through_the_shim(comm):
    comm.all_reduce(torch.ones(2))
    assert _comms._tensor_reader() == ("shim" if SHIM_TORCH else "dlpack")


def _run_reads(env=None, code=None):
    cmd = [sys.executable, "-W", "ignore"]
    cmd += ["-c", code] if code else [str(HERE / "tensor_reads.py")]
    r = subprocess.run(cmd, env={**os.environ, **(env or {})},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip().splitlines()[-1]


def _le_bytes(t):
    return t.reshape(-1).view(torch.uint8).tolist()


def test_shim_and_dlpack_read_every_case_alike():
    shim = json.loads(_run_reads())
    dl = json.loads(_run_reads({"TORCHCOMMS_PY_TENSOR_SHIM": "0"}))
    assert shim["reader"] == ("shim" if SHIM_TORCH else "dlpack")
    assert dl["reader"] == "dlpack"
    assert shim["cases"] == dl["cases"]
    c = shim["cases"]
    # and right, not only alike
    assert c["offset-view"] == ["ok", _le_bytes(torch.arange(7.0, 13.0))]
    assert c["offset-2d"] == ["ok", _le_bytes(torch.arange(6.0, 18.0))]
    assert c["dtype-torch.bfloat16"] == ["ok", _le_bytes(torch.arange(6).to(torch.bfloat16))]
    assert c["zero-dim"] == ["ok", _le_bytes(torch.tensor([3.5]))]
    assert c["empty-offset"] == ["ok", []]
    grown = torch.full((64,), 7.0)
    grown[:4] = torch.arange(4.0)
    assert c["grown"] == ["ok", _le_bytes(grown)]
    # a lazy clone written by the operation is copied first: the source stays
    assert c["cow"] == ["ok", _le_bytes(torch.arange(4.0)), [0] * 16]
    for name in ("transposed", "expanded", "stepped", "channels-last",
                 "size-1-odd-stride", "sparse"):
        assert c[name][0] == "ValueError" and "must be contiguous" in c[name][1], name
    assert c["negative-view"][0] == "ValueError" and "negative view" in c["negative-view"][1]
    assert c["uint16"][0] == "TypeError" and "does not support" in c["uint16"][1]
    assert c["quantized"][0] == "TypeError" and "qint8" in c["quantized"][1]
    assert c["meta"][0] == "ValueError" and "'meta'" in c["meta"][1]
    assert c["no-storage"][0] == "ValueError" and "no storage" in c["no-storage"][1]


def test_shim_only_on_the_checked_torch_release():
    # another release's THPVariable layout is not known: DLPack is used
    code = ("import torch, torchcomms, torchcomms._comms as m\n"
            "torch.__version__ = '2.12.0'\n"
            "c = torchcomms.new_comm('cpu', torch.device('cpu'), name='v')\n"
            "x = torch.arange(3.0)[1:]\n"
            "c.all_reduce(x)\n"
            "print(m._tensor_reader(), x.tolist())\n"
            "c.finalize()\n")
    assert _run_reads(code=code) == "dlpack [1.0, 2.0]"
