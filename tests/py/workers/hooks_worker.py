#!/usr/bin/env python3
"""TorchComm hooks, the flight recorder and the NaN check on real processes
(launched by tests/py/test_hooks_py.py):

    torchrun --standalone --nproc_per_node=2 hooks_worker.py OUTDIR
    torchrun --standalone --nproc_per_node=2 hooks_worker.py OUTDIR process_abort

Every part checks exact values on every rank and records what failed; each
rank writes OUTDIR/hooks-rank<r>.json: {"errors": [...], "parts": [...],
"data": {...}}. The launch sets TORCH_FR_BUFFER_SIZE=4 (the C rings' default
size), so that the flight recorder's max_entries visibly grows them.

Parts:
- direct: pre and post hooks around every operation called on a TorchComm
  (the 18 operations, batch issue, split, finalize): OpName, op_id (pre ==
  post, consecutive, the C flight recorder's op_id), the argument objects
  (the caller's own tensors), post args classes.
- c10d: the same hooks seeing torch.distributed calls over our c10d backend.
- pre_raise: a pre hook's exception propagates unchanged, the operation is
  not issued (no number taken, nothing recorded), and the peer's next
  operation pairs with it normally.
- post_raise: a post hook's exception is reported (sys.unraisablehook) and
  the operation's result stands.
- remove: RemovableHandle.remove() (idempotent), a dropped handle keeps its
  hook, remove() after the communicator is gone.
- abort: abort hooks called by TorchComm.abort() before the abort, an abort
  hook's exception reported and ignored.
- fr: FlightRecorderHook (size, reset, max_entries, dump_json fields, split
  children, unregister, dump_file and its path rules).
- nan: NanCheckHook (NaN in inputs / outputs, Inf and ints, unregister, the
  comm named).
MODE process_abort: abort hooks run before the process aborts on a failed
operation (abort_process_on_timeout_or_error=True): rank 0's all_reduce
loses its peer, its abort hook writes OUTDIR/abort-hook-rank0, then the
process aborts.
"""

import gc
import json
import os
import pickle
import sys
import traceback
from datetime import timedelta

import torch

import torchcomms
from torchcomms import OpName, new_comm
from torchcomms.hooks import FlightRecorderHook, NanCheckHook

ERRORS, PARTS, DATA = [], [], {}
PART = [""]
U64_MAX = 2**64 - 1


def fail(msg):
    ERRORS.append(f"[{PART[0]}] {msg}")


def eq(what, got, exp):
    if isinstance(got, torch.Tensor) or isinstance(exp, torch.Tensor):
        ok = (isinstance(got, torch.Tensor) and isinstance(exp, torch.Tensor)
              and got.dtype == exp.dtype and got.shape == exp.shape and
              bool(torch.equal(got, exp)))
    else:
        ok = got == exp
    if not ok:
        fail(f"{what}: got {got!r} expected {exp!r}")
    return ok


def true(what, cond):
    if not cond:
        fail(what)
    return cond


def run_part(name, fn, *args):
    PART[0] = name
    try:
        fn(*args)
        PARTS.append(name)
    except Exception:  # noqa: BLE001
        fail(f"raised:\n{traceback.format_exc()}")
    PART[0] = ""


class Recorder:
    """Pre and post hooks appending what they get."""

    def __init__(self, comm):
        self.calls = []
        self.pre = comm.register_pre_hook(self.on_pre)
        self.post = comm.register_post_hook(self.on_post)

    def on_pre(self, name, op_id, args):
        self.calls.append(("pre", name, op_id, args))

    def on_post(self, op_id, args):
        self.calls.append(("post", None, op_id, args))

    def take(self):
        calls, self.calls = self.calls, []
        return calls

    def remove(self):
        self.pre.remove()
        self.post.remove()


def fr_ops(comm):
    """op_id -> profiling_name of the entries in comm's C flight recorder."""
    return {e["op_id"]: e["profiling_name"]
            for e in json.loads(comm._fr_dump_json()).get("entries", [])}


def expect_op(rec, what, name, fields, post_cls=None, op_id=None):
    """One pre then one post call: OpName `name`, equal op_ids, the args'
    fields (identity for tensors and lists of tensors), the post args' class
    (by default the operation's own <Op>PostHookArgs, a CollectivePostHookArgs).
    Returns the op_id."""
    calls = rec.take()
    kinds = [(k, n) for k, n, _, _ in calls]
    if not eq(f"{what}: hook calls", kinds, [("pre", name), ("post", None)]):
        return None
    (_, _, pid, pargs), (_, _, qid, qargs) = calls
    eq(f"{what}: pre and post op_id", qid, pid)
    true(f"{what}: op_id is an int", type(pid) is int)
    if op_id is not None:
        eq(f"{what}: op_id", pid, op_id)
    eq(f"{what}: args class", type(pargs).__name__, f"{fields[0]}")
    eq(f"{what}: args fields", list(pargs._fields), [k for k, _ in fields[1:]])
    for k, v in fields[1:]:
        got = getattr(pargs, k)
        if isinstance(v, torch.Tensor):
            true(f"{what}: args.{k} is the caller's tensor", got is v)
        elif isinstance(v, list) and v and isinstance(v[0], torch.Tensor):
            true(f"{what}: args.{k} is a list of the caller's tensors",
                 type(got) is list and len(got) == len(v) and
                 all(a is b for a, b in zip(got, v)))
        else:
            eq(f"{what}: args.{k}", got, v)
    if post_cls is None:
        post_cls = fields[0].replace("PreHookArgs", "PostHookArgs")
        true(f"{what}: post args are CollectivePostHookArgs",
             isinstance(qargs, torchcomms.CollectivePostHookArgs))
    eq(f"{what}: post args", type(qargs).__name__, post_cls)
    return pid


# --------------------------------------------------------------------------

def part_direct(comm):
    r, n = comm.get_rank(), comm.get_size()
    peer = 1 - r
    FlightRecorderHook(max_entries=256).register_with_comm(comm)
    rec = Recorder(comm)
    ids = []

    def op(what, name, cls, fields, call, **kw):
        expected = comm._next_op_id()
        res = call()
        true(f"{what}: returns a TorchWork", isinstance(res, torchcomms.TorchWork))
        res.wait()
        ids.append(expect_op(rec, what, name, [cls] + fields, op_id=expected, **kw))
        return res

    t = torch.full((3,), float(r + 1))
    op("all_reduce", OpName.all_reduce, "AllReducePreHookArgs",
       [("tensor", t), ("async_op", False)], lambda: comm.all_reduce(t))
    eq("all_reduce result", t, torch.full((3,), 3.0))
    t = torch.full((2,), float(r))
    op("broadcast async", OpName.broadcast, "BroadcastPreHookArgs",
       [("tensor", t), ("root", 1), ("async_op", True)],
       lambda: comm.broadcast(t, 1, async_op=True))
    eq("broadcast result", t, torch.full((2,), 1.0))
    t = torch.full((4,), 7.0) if r == 0 else torch.zeros(4)
    if r == 0:
        op("send", OpName.send, "SendPreHookArgs",
           [("tensor", t), ("peer", 1), ("async_op", False)], lambda: comm.send(t, 1))
    else:
        op("recv", OpName.recv, "RecvPreHookArgs",
           [("tensor", t), ("peer", 0), ("async_op", False)], lambda: comm.recv(t, 0))
        eq("recv result", t, torch.full((4,), 7.0))
    t = torch.full((2,), float(r))
    op("reduce", OpName.reduce, "ReducePreHookArgs",
       [("tensor", t), ("root", 0), ("async_op", False)], lambda: comm.reduce(t, 0))
    inp, lst = torch.full((2,), float(r)), [torch.empty(2) for _ in range(n)]
    op("all_gather", OpName.all_gather, "AllGatherPreHookArgs",
       [("input", inp), ("output", lst), ("async_op", False)],
       lambda: comm.all_gather(lst, inp))
    eq("all_gather result", torch.stack(lst), torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
    inp, lst = torch.full((r + 1,), float(r)), [torch.empty(k + 1) for k in range(n)]
    op("all_gather_v", OpName.all_gather_v, "AllGatherVPreHookArgs",
       [("input", inp), ("output", lst), ("async_op", True)],
       lambda: comm.all_gather_v(lst, inp, True))
    inp, out = torch.full((2,), float(r)), torch.empty(2 * n)
    op("all_gather_single", OpName.all_gather_single, "AllGatherSinglePreHookArgs",
       [("input", inp), ("output", out), ("async_op", False)],
       lambda: comm.all_gather_single(out, inp))
    out, lst = torch.empty(2), [torch.full((2,), float(r + k)) for k in range(n)]
    op("reduce_scatter", OpName.reduce_scatter, "ReduceScatterPreHookArgs",
       [("input", lst), ("output", out), ("async_op", False)],
       lambda: comm.reduce_scatter(out, lst))
    out, lst = torch.empty(r + 1), [torch.ones(k + 1) for k in range(n)]
    op("reduce_scatter_v", OpName.reduce_scatter_v, "ReduceScatterVPreHookArgs",
       [("input", lst), ("output", out), ("async_op", False)],
       lambda: comm.reduce_scatter_v(out, lst))
    inp, out = torch.arange(2 * n, dtype=torch.float), torch.empty(2)
    op("reduce_scatter_single", OpName.reduce_scatter_single,
       "ReduceScatterSinglePreHookArgs",
       [("input", inp), ("output", out), ("async_op", False)],
       lambda: comm.reduce_scatter_single(out, inp))
    eq("reduce_scatter_single result", out, torch.arange(2, dtype=torch.float) * 2 + 4 * r)
    inp, out = torch.arange(4, dtype=torch.float), torch.empty(4)
    op("all_to_all_single", OpName.all_to_all_single, "AllToAllSinglePreHookArgs",
       [("input", inp), ("output", out), ("async_op", False)],
       lambda: comm.all_to_all_single(out, inp))
    isp, osp = [1, 1], [1, 1]
    inp, out = torch.arange(2, dtype=torch.float), torch.empty(2)
    op("all_to_all_v_single", OpName.all_to_all_v_single, "AllToAllVSinglePreHookArgs",
       [("input", inp), ("output", out), ("input_split_sizes", [1, 1]),
        ("output_split_sizes", [1, 1]), ("async_op", False)],
       lambda: comm.all_to_all_v_single(out, inp, osp, isp))
    il, ol = [torch.ones(1) for _ in range(n)], [torch.empty(1) for _ in range(n)]
    op("all_to_all", OpName.all_to_all, "AllToAllPreHookArgs",
       [("input", il), ("output", ol), ("async_op", False)],
       lambda: comm.all_to_all(ol, il))
    op("barrier", OpName.barrier, "BarrierPreHookArgs", [("async_op", False)],
       lambda: comm.barrier())
    out, lst = torch.empty(2), [torch.full((2,), float(k)) for k in range(n)]
    op("scatter", OpName.scatter, "ScatterPreHookArgs",
       [("output", out), ("input", lst), ("root", 0), ("async_op", False)],
       lambda: comm.scatter(out, lst, 0))
    eq("scatter result", out, torch.full((2,), float(r)))
    inp, lst = torch.full((2,), float(r)), [torch.empty(2) for _ in range(n)]
    op("gather", OpName.gather, "GatherPreHookArgs",
       [("input", inp), ("output", lst), ("root", 1), ("async_op", False)],
       lambda: comm.gather(lst, inp, 1))
    inp, out = torch.full((2,), float(r)), torch.empty(2 * n)
    op("gather_single", OpName.gather_single, "GatherSinglePreHookArgs",
       [("input", inp), ("output", out), ("root", 0), ("async_op", False)],
       lambda: comm.gather_single(out, inp, 0))
    b = comm.batch_op_create()
    s, rcv = torch.full((3,), float(r)), torch.empty(3)
    b.send(s, peer)
    b.recv(rcv, peer)
    op("batch issue", OpName.batch_op_issue, "BatchOpIssuePreHookArgs",
       [("num_ops", 2), ("async_op", False)], lambda: b.issue(),
       post_cls="BatchOpIssuePostHookArgs")
    eq("batch result", rcv, torch.full((3,), float(peer)))

    eq("op_ids are consecutive", ids, list(range(ids[0], ids[0] + len(ids))))
    DATA["direct_op_ids"] = ids
    # the C flight recorder numbers them the same
    names = fr_ops(comm)
    expected = ["all_reduce", "broadcast", "send" if r == 0 else "recv", "reduce",
                "all_gather", "all_gather_v", "all_gather_single", "reduce_scatter",
                "reduce_scatter_v", "reduce_scatter_single", "all_to_all_single",
                "all_to_all_v_single", "all_to_all", "barrier", "scatter", "gather",
                "gather", "coalesced"]  # (the analyser knows no gather_single: "gather")
    got = [names.get(i, "?").split(":")[1].split(" ")[0] for i in ids]
    eq("the C flight recorder's names at the hooks' op_ids", got, expected)

    # split: pre gets ranks and name; the op_id is that of the split's first
    # all_gather_single (the groups; a second one tells every rank whether
    # any member saw a different list); post gets a SplitPostHookArgs
    expected = comm._next_op_id()
    child = comm.split([0, 1], "hooks_child")
    sid = expect_op(rec, "split", OpName.split,
                    ["SplitPreHookArgs", ("ranks", [0, 1]), ("name", "hooks_child")],
                    post_cls="SplitPostHookArgs", op_id=expected)
    eq("split's op_id in the flight recorder", fr_ops(comm).get(sid), "gloo:all_gather_single")
    eq("split took two numbers", comm._next_op_id(), expected + 2)
    eq("its second exchange in the flight recorder", fr_ops(comm).get(sid + 1),
       "gloo:all_gather_single")
    # the child has no hooks of its parent
    child.barrier()
    eq("the child's operations call the parent's hooks", rec.take(), [])
    # a split that returns None calls no post hook
    none = comm.split([], "nobody")
    calls = rec.take()
    eq("split([]) returns None", none, None)
    eq("split([]) calls the pre hook only", [(k, c) for k, c, _, _ in calls],
       [("pre", OpName.split)])
    eq("split([]) pre args", tuple(calls[0][3]), ([], "nobody"))
    child.finalize()
    # finalize: op_id 2**64-1, takes no number
    before = comm._next_op_id()
    comm.finalize()
    expect_op(rec, "finalize", OpName.finalize, ["FinalizePreHookArgs"],
              post_cls="FinalizePostHookArgs", op_id=U64_MAX)
    eq("finalize took no number", comm._next_op_id(), before)


def part_c10d():
    import torch.distributed as dist

    torchcomms.register_c10d_backend()
    dist.init_process_group(backend="torchcomms", timeout=timedelta(seconds=60))
    r = dist.get_rank()
    comm = dist.group.WORLD.get_comm()
    FlightRecorderHook(max_entries=256).register_with_comm(comm)
    rec = Recorder(comm)
    ids = []

    def op(what, name, fields, call, **kw):
        expected = comm._next_op_id()
        call()
        ids.append(expect_op(rec, what, name, fields, op_id=expected, **kw))

    t = torch.full((3,), float(r + 1))
    op("dist.all_reduce", OpName.all_reduce,
       ["AllReducePreHookArgs", ("tensor", t), ("async_op", False)],
       lambda: dist.all_reduce(t))
    eq("dist.all_reduce result", t, torch.full((3,), 3.0))
    t = torch.full((2,), float(r))
    w = [None]
    op("dist.broadcast async", OpName.broadcast,
       ["BroadcastPreHookArgs", ("tensor", t), ("root", 1), ("async_op", True)],
       lambda: w.__setitem__(0, dist.broadcast(t, src=1, async_op=True)))
    w[0].wait()
    eq("dist.broadcast result", t, torch.ones(2))
    out, inp = torch.empty(4), torch.full((2,), float(r))
    op("dist.all_gather_into_tensor", OpName.all_gather_single,
       ["AllGatherSinglePreHookArgs", ("input", inp), ("output", out), ("async_op", False)],
       lambda: dist.all_gather_into_tensor(out, inp))
    out, inp = torch.empty(2), torch.arange(4, dtype=torch.float)
    op("dist.reduce_scatter_tensor", OpName.reduce_scatter_single,
       ["ReduceScatterSinglePreHookArgs", ("input", inp), ("output", out),
        ("async_op", False)],
       lambda: dist.reduce_scatter_tensor(out, inp))
    op("dist.barrier", OpName.barrier, ["BarrierPreHookArgs", ("async_op", False)],
       lambda: dist.barrier())
    t = torch.full((5,), 9.0) if r == 0 else torch.zeros(5)
    if r == 0:
        op("dist.send", OpName.send,
           ["SendPreHookArgs", ("tensor", t), ("peer", 1), ("async_op", True)],
           lambda: dist.send(t, dst=1))
    else:
        op("dist.recv", OpName.recv,
           ["RecvPreHookArgs", ("tensor", t), ("peer", 0), ("async_op", True)],
           lambda: dist.recv(t, src=0))
        eq("dist.recv result", t, torch.full((5,), 9.0))
    eq("op_ids are consecutive", ids, list(range(ids[0], ids[0] + len(ids))))
    names = fr_ops(comm)
    got = [names.get(i, "?").split(":")[1].split(" ")[0] for i in ids]
    eq("the C flight recorder's names at the hooks' op_ids", got,
       ["all_reduce", "broadcast", "all_gather_single", "reduce_scatter_single", "barrier",
        "send" if r == 0 else "recv"])
    DATA["c10d_op_ids"] = ids
    rec.remove()
    dist.destroy_process_group()


def part_pre_raise(comm):
    r = comm.get_rank()
    err = KeyError("refused by the test")
    seen = []

    def refuse(name, op_id, args):
        seen.append((name, op_id))
        raise err

    t = torch.full((3,), float(r + 1))
    n0, size0 = comm._next_op_id(), comm._fr_size()
    if r == 0:
        h = comm.register_pre_hook(refuse)
        try:
            comm.all_reduce(t)
            fail("all_reduce refused by a pre hook returned")
        except KeyError as e:
            true(f"the pre hook's own exception propagates (got {e!r})", e is err)
        h.remove()
        eq("the refused hook saw the op", seen, [(OpName.all_reduce, n0)])
        eq("not issued: no number taken", comm._next_op_id(), n0)
        eq("not issued: nothing recorded", comm._fr_size(), size0)
        eq("not issued: the tensor is unchanged", t, torch.full((3,), 1.0))
    # both ranks' next all_reduce pair with each other: numbering intact
    t = torch.full((3,), float(10 * (r + 1)))
    comm.all_reduce(t)
    eq("the next all_reduce pairs normally", t, torch.full((3,), 30.0))
    eq("it got the number the refused one would have", comm._next_op_id(), n0 + 1)
    e = json.loads(comm._fr_dump_json())["entries"][-1]
    eq("its flight recorder entry", (e["op_id"], e["profiling_name"]), (n0, "gloo:all_reduce"))
    # the same on both ranks (the test compares them)
    DATA["pre_raise"] = [n0, e["collective_seq_id"]]


def part_post_raise(comm):
    r = comm.get_rank()
    caught = []
    old = sys.unraisablehook
    sys.unraisablehook = lambda u: caught.append(
        (u.exc_type, str(u.exc_value), u.err_msg, u.object))

    def bad_post(op_id, args):
        raise ValueError(f"post hook failed for {op_id}")

    after = []
    h = comm.register_post_hook(bad_post)
    h2 = comm.register_post_hook(lambda op_id, args: after.append(op_id))
    try:
        n0 = comm._next_op_id()
        t = torch.full((4,), float(r + 1))
        w = comm.all_reduce(t)
        true("the result is a completed TorchWork", isinstance(w, torchcomms.TorchWork)
             and w.is_completed())
        eq("the result stands", t, torch.full((4,), 3.0))
        t2 = torch.full((2,), float(r))
        w = comm.all_reduce(t2, async_op=True)
        w.wait()
        eq("the async result stands", t2, torch.full((2,), 1.0))
    finally:
        sys.unraisablehook = old
        h.remove()
        h2.remove()
    eq("the reports", [(c[0], c[1], c[2]) for c in caught],
       [(ValueError, f"post hook failed for {n0}",
         f"Exception ignored in post hook of 'all_reduce' (op_id {n0})"),
        (ValueError, f"post hook failed for {n0 + 1}",
         f"Exception ignored in post hook of 'all_reduce' (op_id {n0 + 1})")])
    true("the report names the hook", all(c[3] is bad_post for c in caught))
    eq("the next post hook still ran", after, [n0, n0 + 1])


def part_remove(comm):
    calls = []
    h = comm.register_pre_hook(lambda n, i, a: calls.append(("a", i)))
    comm.register_pre_hook(lambda n, i, a: calls.append(("b", i)))  # handle dropped
    gc.collect()
    n0 = comm._next_op_id()
    comm.barrier()
    eq("both hooks, in registration order", calls, [("a", n0), ("b", n0)])
    true("remove() returns None", h.remove() is None)
    h.remove()  # idempotent
    calls.clear()
    comm.barrier()
    eq("the removed hook is not called; the dropped handle's is", calls, [("b", n0 + 1)])
    # remove after the communicator is gone
    sub = comm.split([0, 1], "remove_sub")
    hs = [sub.register_pre_hook(lambda *a: None), sub.register_post_hook(lambda *a: None),
          sub.register_abort_hook(lambda: None)]
    sub.finalize()
    del sub
    gc.collect()
    for h in hs:
        true("remove() after the communicator is gone is a no-op", h.remove() is None)
    eq("repr of a removed handle", repr(hs[0]).endswith("(removed)>"), True)
    for bad in (None, 3):
        try:
            comm.register_pre_hook(bad)
            fail(f"register_pre_hook({bad!r}) accepted")
        except TypeError as e:
            eq("register_pre_hook(not callable)", str(e),
               f"register_pre_hook: argument 'callback' must be callable, not "
               f"{type(bad).__name__}")


def part_abort(comm):
    sub = comm.split([0, 1], "abort_sub")
    order = []
    caught = []
    old = sys.unraisablehook
    sys.unraisablehook = lambda u: caught.append((u.exc_type, str(u.exc_value), u.err_msg))

    def first():
        order.append(("first", sub.is_aborted()))

    def broken():
        order.append(("broken", sub.is_aborted()))
        raise RuntimeError("abort hook failed")

    try:
        h1 = sub.register_abort_hook(first)
        sub.register_abort_hook(broken)
        h3 = sub.register_abort_hook(lambda: order.append(("third", sub.is_aborted())))
        h3.remove()
        true("abort() returns None", sub.abort() is None)
    finally:
        sys.unraisablehook = old
    eq("abort hooks ran before the abort, in order", order,
       [("first", False), ("broken", False)])
    eq("the failing abort hook is reported", caught,
       [(RuntimeError, "abort hook failed", "Exception ignored in abort hook of 'abort'")])
    true("aborted", sub.is_aborted())
    order.clear()
    sub.abort()
    eq("a second abort calls no hook", order, [])
    h1.remove()
    # the parent is untouched
    t = torch.ones(2)
    comm.all_reduce(t)
    eq("the parent still works", t, torch.full((2,), 2.0))


def part_fr(comm, outdir):
    r = comm.get_rank()
    sub = comm.split([0, 1], "fr_sub")
    rec = FlightRecorderHook(max_entries=10)
    eq("is_enabled before registration", rec.is_enabled(), False)
    sub.barrier()  # before registration: not counted
    rec.register_with_comm(sub)
    eq("is_enabled", rec.is_enabled(), True)
    eq("size() after registration", (rec.size(), len(rec)), (0, 0))
    x = torch.ones(3, 4)
    sub.all_reduce(x)
    eq("size() 1", rec.size(), 1)
    sub.broadcast(torch.ones(5, dtype=torch.int64), 0)
    eq("size() 2", rec.size(), 2)
    d = json.loads(rec.dump_json())
    eq("top-level keys", sorted(d), ["comm_lib_version", "entries", "pg_config",
                                     "pg_status", "rank", "version"])
    eq("version", d["version"], "2.10")
    eq("pg_config", d["pg_config"], {"fr_sub": {"name": "fr_sub", "desc": "cpu",
                                                 "ranks": "[0, 1]"}})
    e0, e1 = d["entries"]
    eq("profiling_names", [e0["profiling_name"], e1["profiling_name"]],
       ["gloo:all_reduce", "gloo:broadcast"])
    eq("all_reduce sizes", (e0["input_sizes"], e0["input_dtypes"], e0["output_sizes"],
                            e0["output_dtypes"]), ([[12]], ["Float"], [[12]], ["Float"]))
    eq("broadcast dtypes", (e1["input_dtypes"], e1["output_sizes"]), (["Long"], [[5]]))
    eq("states", (e0["state"], e1["state"], e0["retired"]), ("completed", "completed", True))
    eq("process_group", e0["process_group"], ["fr_sub", "cpu"])
    true("record_id increases, times do not decrease",
         e1["record_id"] == e0["record_id"] + 1 and
         e1["time_created_ns"] >= e0["time_created_ns"] > 0)
    eq("collective_seq_ids", (e0["collective_seq_id"], e1["collective_seq_id"]),
       (e0["collective_seq_id"], e0["collective_seq_id"] + 1))
    true("duration_ms >= 0", e0["duration_ms"] >= 0)
    eq("include_completed=False", json.loads(rec.dump_json(include_completed=False))["entries"],
       [])
    rec.reset()
    eq("size() after reset", rec.size(), 0)
    sub.all_reduce(x)
    eq("size() after reset and one op", rec.size(), 1)
    eq("after reset only the new op shows",
       [e["profiling_name"] for e in json.loads(rec.dump_json())["entries"]],
       ["gloo:all_reduce"])
    # TORCH_FR_BUFFER_SIZE=4 (the launch): max_entries=10 grows the ring to 10
    for _ in range(15):
        sub.all_reduce(x)
    eq("the ring holds max_entries=10 (the C default is 4)", rec.size(), 10)
    # a smaller max_entries never shrinks a ring
    sub2 = comm.split([0, 1], "fr_sub2")
    rec2 = FlightRecorderHook(max_entries=2)
    rec2.register_with_comm(sub2)
    for _ in range(6):
        sub2.barrier()
    eq("max_entries=2 keeps the default ring of 4", rec2.size(), 4)
    # max_entries=0 (torch's default when TORCH_FR_BUFFER_SIZE is unset) keeps it too
    rec0 = FlightRecorderHook(0)
    rec0.register_with_comm(sub2)
    for _ in range(6):
        sub2.barrier()
    eq("max_entries=0 keeps the ring", rec0.size(), 4)
    # split children are registered; dump_json merges the communicators
    rec.reset()
    child = sub.split([0, 1], "fr_child")
    child.all_reduce(x)
    d = json.loads(rec.dump_json())
    eq("merged pg_config", sorted(d["pg_config"]), ["fr_child", "fr_sub"])
    eq("merged entries (pg_id: registration order)",
       [(e["pg_id"], e["process_group"][0], e["profiling_name"]) for e in d["entries"]],
       [(0, "fr_sub", "gloo:all_gather_single"), (0, "fr_sub", "gloo:all_gather_single"),
        (1, "fr_child", "gloo:all_reduce")])
    eq("size() counts both", rec.size(), 3)
    # dump_file: TORCHCOMM_FR_DUMP_TEMP_FILE + rank, a pickle torch's analyser reads
    os.environ["TORCHCOMM_FR_DUMP_TEMP_FILE"] = os.path.join(outdir, "fr_trace_")
    path = rec.dump_file(r)
    eq("dump_file path", path, os.path.join(outdir, f"fr_trace_{r}"))
    with open(path, "rb") as f:
        dump = pickle.load(f)
    eq("dump version", dump["version"], "2.10")
    true("dump has the child's all_reduce",
         any(e["profiling_name"] == "gloo:all_reduce" and e["process_group"][0] == "fr_child"
             for e in dump["entries"]))
    os.environ["TORCHCOMM_FR_DUMP_DYNAMIC_FILE_NAME"] = "1"
    os.environ["TORCHCOMM_FR_DUMP_TEMP_FILE"] = os.path.join(outdir, f"dyn_{r}.pkl")
    eq("dynamic file name: the variable itself", rec.dump_file(r),
       os.path.join(outdir, f"dyn_{r}.pkl"))
    true("the dynamic file exists", os.path.exists(os.path.join(outdir, f"dyn_{r}.pkl")))
    del os.environ["TORCHCOMM_FR_DUMP_DYNAMIC_FILE_NAME"]
    del os.environ["TORCHCOMM_FR_DUMP_TEMP_FILE"]
    rec.unregister()
    eq("after unregister", (rec.is_enabled(), rec.size()), (False, 0))
    grand = child.split([0, 1], "fr_grandchild")  # not followed any more
    eq("no comm after unregister", json.loads(rec.dump_json())["entries"], [])
    for c in (grand, child, sub2, sub):
        c.finalize()


def part_nan(comm):
    r = comm.get_rank()
    name = comm.get_name()
    hook = NanCheckHook()
    hook.register_with_comm(comm)
    eq("is_enabled", hook.is_enabled(), True)
    n0 = comm._next_op_id()
    t = torch.tensor([1.0, float("nan"), 3.0])
    try:
        comm.all_reduce(t)
        fail("all_reduce with NaN input passed")
    except RuntimeError as e:
        eq("NaN all_reduce message", str(e),
           f"NaN detected in input tensor for 'all_reduce' on comm '{name}': "
           f"NaN found in input tensor. (rank {r})")
    eq("the NaN all_reduce was not issued", comm._next_op_id(), n0)
    try:
        comm.broadcast(torch.tensor([float("nan")], dtype=torch.bfloat16), 0)
        fail("broadcast with NaN passed")
    except RuntimeError as e:
        eq("NaN broadcast message", str(e),
           f"NaN detected in input tensor for 'broadcast' on comm '{name}': "
           f"NaN found in input tensor. (rank {r})")
    t = torch.tensor([float("inf"), 1.0])
    comm.all_reduce(t)
    eq("Inf passes", t, torch.tensor([float("inf"), 2.0]))
    t = torch.tensor([1, 2], dtype=torch.int32)
    comm.all_reduce(t)
    eq("ints pass", t, torch.tensor([2, 4], dtype=torch.int32))
    comm.barrier()
    # outputs are not checked by default
    out = torch.full((4,), float("nan"))
    comm.all_gather_single(out, torch.full((2,), float(r)))
    eq("NaN output with check_outputs=False", out, torch.tensor([0.0, 0.0, 1.0, 1.0]))
    hook.unregister()
    eq("is_enabled after unregister", hook.is_enabled(), False)
    t = torch.tensor([float("nan")])
    comm.all_reduce(t)
    true("after unregister NaN passes", bool(torch.isnan(t).all()))
    # outputs only, on a second communicator: the message names it
    sub = comm.split([0, 1], "nan_comm1")
    out_hook = NanCheckHook(check_inputs=False, check_outputs=True)
    out_hook.register_with_comm(sub)
    out = torch.full((4,), float("nan"))
    try:
        sub.all_gather_single(out, torch.zeros(2))
        fail("all_gather_single with a NaN output passed")
    except RuntimeError as e:
        eq("NaN output message", str(e),
           f"NaN detected in output tensor for 'all_gather_single' on comm 'nan_comm1': "
           f"NaN found in input tensor. (rank {r})")
    out = torch.zeros(4)  # not empty(): it may reuse the NaN-filled buffer freed above
    sub.all_gather_single(out, torch.full((2,), float("nan")))
    true("NaN input with check_inputs=False passes", bool(torch.isnan(out).all()))
    out_hook.unregister()
    sub.finalize()


def process_abort(outdir):
    r = int(os.environ["RANK"])
    comm = new_comm("cpu", "cpu", name="abort_world", abort_process_on_timeout_or_error=True,
                    timeout=timedelta(seconds=20))
    t = torch.ones(2)
    comm.all_reduce(t)
    if r == 1:
        # leaves: rank 0's next all_reduce loses its peer
        print("rank 1 leaving", flush=True)
        os._exit(0)

    def hook():
        with open(os.path.join(outdir, "abort-hook-rank0"), "w") as f:
            f.write(f"abort hook ran; aborted={comm.is_aborted()}")

    comm.register_abort_hook(hook)
    comm.all_reduce(t)
    print("rank 0 survived the failed all_reduce", flush=True)  # must not happen


def main():
    outdir = sys.argv[1]
    if len(sys.argv) > 2 and sys.argv[2] == "process_abort":
        process_abort(outdir)
        return
    comm = new_comm("cpu", "cpu", name="hooks_world", timeout=timedelta(seconds=60))
    r = comm.get_rank()
    work = comm.split([0, 1], "work")
    run_part("direct", part_direct, comm)
    run_part("c10d", part_c10d)
    run_part("pre_raise", part_pre_raise, work)
    run_part("post_raise", part_post_raise, work)
    run_part("remove", part_remove, work)
    run_part("abort", part_abort, work)
    run_part("fr", part_fr, work, outdir)
    run_part("nan", part_nan, work)
    work.finalize()
    with open(os.path.join(outdir, f"hooks-rank{r}.json"), "w") as f:
        json.dump({"errors": ERRORS, "parts": PARTS, "data": DATA}, f)
    print(f"rank {r}: {len(ERRORS)} errors, parts {PARTS}", flush=True)
    sys.exit(1 if ERRORS else 0)


if __name__ == "__main__":
    main()
