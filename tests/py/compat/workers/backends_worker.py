"""Backends written in Python, on every rank (tests/py/compat/test_compat_backends.py).

The backend under test, Inner, is a TorchCommBackend subclass registered with
torchcomms.register_backend: each of its operations runs on an inner native
"cpu" communicator, so the ranks really communicate through it. Every result
is checked exactly against values computed here, and the list of Python
methods the core called (name, async_op) against the list expected.
"""
import datetime
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from compat_lib import Worker  # noqa: E402

import torch  # noqa: E402
import torchcomms  # noqa: E402
from torchcomms import ReduceOp, TorchCommBackend  # noqa: E402

w = Worker()
R, N = w.rank, w.size
OPS = ("send", "recv", "broadcast", "all_reduce", "reduce", "all_gather", "all_gather_v",
       "all_gather_single", "reduce_scatter", "reduce_scatter_v", "reduce_scatter_single",
       "all_to_all_single", "all_to_all_v_single", "all_to_all", "barrier", "scatter",
       "gather")  # gather_single: TorchCommBackend's default (through gather)


class Inner(TorchCommBackend):
    def __init__(self, inner=None, name=None):
        super().__init__()
        self.inner, self.name = inner, name
        self.calls, self.timeouts, self.finalized = [], [], False

    def init(self, device, name, options):
        self.device, self.name, self.options = device, name, options
        self.inner = torchcomms.new_comm("cpu", device, name=name + "-inner")

    def finalize(self):
        self.inner.finalize()
        self.finalized = True

    def get_rank(self):
        return self.inner.get_rank()

    def get_size(self):
        return self.inner.get_size()

    def get_backend_name(self):
        return "inner"

    def get_comm_name(self):
        return self.name

    def set_timeout(self, timeout):
        self.timeouts.append(timeout)

    def split(self, ranks, name, options):
        self.calls.append(("split", list(ranks)))
        child = self.inner.split(ranks, name + "-inner")
        return None if child is None else Inner(child, name)


def _forward(op):
    def method(self, *args):  # args end with async_op
        self.calls.append((op, args[-1]))
        work = getattr(self.inner, op)(*args)
        return work if args[-1] else None
    method.__name__ = op
    return method


for _op in OPS:
    setattr(Inner, _op, _forward(_op))

torchcomms.register_backend("inner", Inner)
t0 = time.monotonic()
comm = torchcomms.new_comm("inner", torch.device("cpu"), name="py")
CREATE_S = time.monotonic() - t0
impl = comm.get_backend_impl()
# A Python backend finds its peers itself; the core's bookkeeping store is
# this rank's own. Once, every rank but 0 waited STALL_S (10 s) there for a
# hang-board key only rank 0's own store held: the creations, the splits
# and the first operations took 10 s each. Creation takes well under 1 s.
STALL_S = 10.0


def f32(*v):
    return torch.tensor(v, dtype=torch.float32)


@w.part("create")
def _(c):
    c.eq("rank", comm.get_rank(), R)
    c.eq("size", comm.get_size(), N)
    c.eq("get_backend", comm.get_backend(), "inner")
    c.eq("get_name", comm.get_name(), "py")
    c.true("get_backend_impl is the Inner instance new_comm made",
           type(impl) is Inner and impl.name == "py" and impl.inner is not None)
    c.true("the same object on every call", comm.get_backend_impl() is impl)
    c.eq("init's device", impl.device, torch.device("cpu"))
    c.eq("init's options", type(impl.options).__name__, "CommOptions")
    c.true("registered", torchcomms._is_backend_registered("inner"))
    c.true(f"created without waiting on a store no peer writes ({CREATE_S:.2f} s)",
           CREATE_S < STALL_S / 2)


@w.part("collectives")
def _(c):
    impl.calls.clear()
    tri = N * (N + 1) // 2
    t = torch.full((5,), float(R + 1))
    comm.all_reduce(t, ReduceOp.SUM, async_op=False)
    c.eq("all_reduce SUM", t, torch.full((5,), float(tri)))
    t = torch.tensor([R, -R, 7], dtype=torch.int64)
    comm.all_reduce(t, ReduceOp.MAX, async_op=False)
    c.eq("all_reduce MAX int64", t, torch.tensor([N - 1, 0, 7]))
    t = torch.full((3,), float(R + 1))
    comm.reduce(t, N - 1, ReduceOp.SUM, async_op=False)
    c.eq("reduce at root", t, torch.full((3,), float(tri) if R == N - 1 else float(R + 1)))
    t = torch.arange(4, dtype=torch.float32) + 10 * R
    comm.broadcast(t, 1, async_op=False)
    c.eq("broadcast from 1", t, torch.arange(4, dtype=torch.float32) + 10)
    outs = [torch.zeros(2) for _ in range(N)]
    comm.all_gather(outs, f32(R, R + 0.5), async_op=False)
    c.eq("all_gather", torch.stack(outs), torch.tensor([[i, i + 0.5] for i in range(N)]))
    outs = [torch.zeros(i + 1) for i in range(N)]
    comm.all_gather_v(outs, torch.full((R + 1,), float(R)), async_op=False)
    c.eq("all_gather_v", torch.cat(outs),
         torch.cat([torch.full((i + 1,), float(i)) for i in range(N)]))
    out = torch.zeros(2 * N)
    comm.all_gather_single(out, f32(R, -R), async_op=False)
    c.eq("all_gather_single", out, torch.tensor([v for i in range(N) for v in (i, -i)],
                                                dtype=torch.float32))
    out = torch.zeros(3)
    comm.reduce_scatter(out, [torch.full((3,), float(10 * R + j)) for j in range(N)],
                        ReduceOp.SUM, async_op=False)
    c.eq("reduce_scatter", out, torch.full((3,), float(10 * N * (N - 1) // 2 + N * R)))
    out = torch.zeros(R + 1)
    comm.reduce_scatter_v(out, [torch.full((j + 1,), float(R + j)) for j in range(N)],
                          ReduceOp.SUM, async_op=False)
    c.eq("reduce_scatter_v", out, torch.full((R + 1,), float(N * (N - 1) // 2 + N * R)))
    out = torch.zeros(2)
    comm.reduce_scatter_single(out, torch.arange(2 * N, dtype=torch.float32) * (R + 1),
                               ReduceOp.SUM, async_op=False)
    c.eq("reduce_scatter_single", out, f32(2 * R * tri, (2 * R + 1) * tri))
    out = torch.zeros(N)
    comm.all_to_all_single(out, torch.tensor([100. * R + j for j in range(N)]), async_op=False)
    c.eq("all_to_all_single", out, torch.tensor([100. * j + R for j in range(N)]))
    inp = torch.cat([torch.full((j + 1, 2), 1000. * R + j) for j in range(N)])
    out = torch.zeros(N * (R + 1), 2)
    comm.all_to_all_v_single(out, inp, [R + 1] * N, [j + 1 for j in range(N)], async_op=False)
    c.eq("all_to_all_v_single", out,
         torch.cat([torch.full((R + 1, 2), 1000. * i + R) for i in range(N)]))
    outs = [torch.zeros(1) for _ in range(N)]
    comm.all_to_all(outs, [f32(10 * R + j) for j in range(N)], async_op=False)
    c.eq("all_to_all", torch.cat(outs), torch.tensor([10. * i + R for i in range(N)]))
    peer = R + 1 if R % 2 == 0 else R - 1
    got = torch.zeros(3)
    if R % 2 == 0:
        comm.send(torch.full((3,), float(R)), peer, async_op=False)
        comm.recv(got, peer, async_op=False)
    else:
        comm.recv(got, peer, async_op=False)
        comm.send(torch.full((3,), float(R)), peer, async_op=False)
    c.eq("send / recv with the pair's peer", got, torch.full((3,), float(peer)))
    comm.barrier(async_op=False)
    out = torch.zeros(2)
    comm.scatter(out, [torch.full((2,), 7. * j) for j in range(N)] if R == 0 else [], 0,
                 async_op=False)
    c.eq("scatter from 0", out, torch.full((2,), 7. * R))
    outs = [torch.zeros(2) for _ in range(N)] if R == N - 1 else []
    comm.gather(outs, f32(R, R * R), N - 1, async_op=False)
    if R == N - 1:
        c.eq("gather at N-1", torch.stack(outs), torch.tensor([[i, i * i] for i in range(N)],
                                                               dtype=torch.float32))
    out = torch.zeros(N) if R == 0 else torch.zeros(0)
    comm.gather_single(out, f32(R + 0.25), 0, async_op=False)
    if R == 0:
        c.eq("gather_single at 0 (TorchCommBackend's default: gather)", out,
             torch.tensor([i + 0.25 for i in range(N)]))
    first = ["all_reduce", "all_reduce", "reduce", "broadcast", "all_gather", "all_gather_v",
             "all_gather_single", "reduce_scatter", "reduce_scatter_v", "reduce_scatter_single",
             "all_to_all_single", "all_to_all_v_single", "all_to_all"]
    p2p = ["send", "recv"] if R % 2 == 0 else ["recv", "send"]
    c.eq("the Python methods the core called, in order",
         impl.calls, [(m, False) for m in first + p2p + ["barrier", "scatter", "gather",
                                                         "gather"]])
    w.figures["ops"] = len(impl.calls)


@w.part("async_hooks_fr")
def _(c):
    impl.calls.clear()
    seen = []
    h1 = comm.register_pre_hook(lambda name, op_id, args: seen.append(("pre", name.name)))
    h2 = comm.register_post_hook(lambda op_id, args: seen.append(("post", op_id)))
    t = torch.full((4,), float(R))
    work = comm.all_reduce(t, ReduceOp.SUM, async_op=True)
    work.wait()
    c.true("is_completed after wait", work.is_completed())
    c.eq("async all_reduce", t, torch.full((4,), float(N * (N - 1) // 2)))
    outs = [torch.zeros(1) for _ in range(N)]
    w2 = comm.all_gather(outs, f32(R), async_op=True)
    w3 = comm.barrier(async_op=True)
    w2.wait()
    w3.wait()
    c.eq("async all_gather", torch.cat(outs), torch.arange(N, dtype=torch.float32))
    h1.remove()
    h2.remove()
    c.eq("the backend saw async_op=True", impl.calls,
         [("all_reduce", True), ("all_gather", True), ("barrier", True)])
    c.eq("pre hooks", [s for s in seen if s[0] == "pre"],
         [("pre", "all_reduce"), ("pre", "all_gather"), ("pre", "barrier")])
    c.eq("post hooks ran once per operation", len([s for s in seen if s[0] == "post"]), 3)
    dump = json.loads(comm._fr_dump_json())
    entries = dump["entries"]
    c.eq("the dump is this communicator's", {tuple(e["process_group"]) for e in entries},
         {("py", "inner")})
    names = [e["profiling_name"] for e in entries]
    w.figures["fr_names"] = names[-3:]
    c.eq("the flight recorder's last entries", [n.split(":")[-1] for n in names[-3:]],
         ["all_reduce", "all_gather", "barrier"])
    c.eq("their states", [e["state"] for e in entries[-3:]], ["completed"] * 3)
    c.eq("their async_op", [e["async_op"] for e in entries[-3:]], [True] * 3)
    comm.set_timeout(datetime.timedelta(seconds=123))
    c.eq("set_timeout reaches the backend", impl.timeouts[-1], datetime.timedelta(seconds=123))
    c.eq("and the communicator", comm.get_options().timeout, datetime.timedelta(seconds=123))


@w.part("split")
def _(c):
    impl.calls.clear()
    half = list(range(N // 2)) if R < N // 2 else list(range(N // 2, N))
    t0 = time.monotonic()
    child = comm.split(half, "half")
    dt = time.monotonic() - t0
    c.true(f"split without waiting on a store no peer writes ({dt:.2f} s)", dt < STALL_S / 2)
    c.eq("child size", child.get_size(), N // 2)
    c.eq("child rank", child.get_rank(), half.index(R))
    cimpl = child.get_backend_impl()
    c.true("the child's backend is the Inner split returned",
           type(cimpl) is Inner and cimpl.name == "half")
    t = torch.full((2,), float(R))
    child.all_reduce(t, ReduceOp.SUM, async_op=False)
    c.eq("all_reduce on the child", t, torch.full((2,), float(sum(half))))
    c.eq("the parent agreed on the groups through its all_gather_single (the lists, "
         "then whether any member saw a different one), then split",
         impl.calls, [("all_gather_single", False), ("all_gather_single", False),
                      ("split", half)])
    impl.calls.clear()
    pair = comm.split([0, 1] if R < 2 else [], "pair")
    c.eq("in no group: None", pair is None, R >= 2)
    c.eq("split is called on every rank ([] outside the groups)", impl.calls[-1],
         ("split", [0, 1] if R < 2 else []))
    child.finalize()
    c.true("child finalize reached its backend", cimpl.finalized)
    if pair is not None:
        pair.finalize()


class Flaky(Inner):
    def broadcast(self, tensor, root, async_op):
        raise ValueError(f"no broadcast on rank {self.get_rank()}")

    scatter = TorchCommBackend.scatter  # pure again


@w.part("errors")
def _(c):
    torchcomms.register_backend("flaky", Flaky)
    fc = torchcomms.new_comm("flaky", "cpu", name="flaky")
    t = torch.ones(2)
    with c.raises(ValueError, f"^no broadcast on rank {R}$"):
        fc.broadcast(t, 0, async_op=False)
    work = fc.broadcast(t, 0, async_op=True)
    with c.raises(RuntimeError, r"torchcomms: broadcast on 'flaky' \(rank \d of \d\): the Python "
                  f"backend's broadcast raised ValueError: no broadcast on rank {R}"):
        work.wait()
    with c.raises(RuntimeError, r'^Tried to call pure virtual function "TorchCommBackend::scatter"$'):
        fc.scatter(torch.zeros(1), [torch.zeros(1)] * N if R == 0 else [], 0, async_op=False)
    b = fc.batch_op_create()
    b.send(torch.ones(1), (R + 1) % N)
    b.recv(torch.zeros(1), (R - 1) % N)
    with c.raises(RuntimeError, "backend 'flaky' does not implement batch_op_issue"):
        b.issue(False)
    t = torch.full((2,), 1.0)
    fc.all_reduce(t, ReduceOp.SUM, async_op=False)
    c.eq("the communicator still works after its backend raised", t, torch.full((2,), float(N)))
    fc.finalize()


@w.part("finalize")
def _(c):
    comm.finalize()
    c.true("finalize reached the backend", impl.finalized)
    with c.raises(RuntimeError, "finalized"):
        comm.all_reduce(torch.ones(1), ReduceOp.SUM, async_op=False)


sys.exit(w.finish())
