"""Contract details of torchcomms' TorchComm / TorchWork / CommOptions on
the cpu backend (issue 13, point 4), run on every rank under torchrun.

Reference behaviour (meta-pytorch/torchcomms):
- split: backends check the list before any communication and raise
  RuntimeError ("Duplicate ranks found in ranks list", "Current rank N is not
  included in the provided ranks list", "Invalid rank ..."); [] returns None
  (tests/integration/py/SplitTest.py: test_duplicate_ranks,
  test_rank_not_in_group). Here the refusal is also agreed between the ranks,
  so a refusal on one rank fails the split on all of them, none waits.
- TorchWork.wait_blocking: TorchWork::waitBlocking's default raises
  RuntimeError "[TorchWork]: waitBlocking not implemented for this work type"
  (WaitBlockingTest.test_wait_blocking_unsupported_backend); wait() still
  completes the work afterwards.
- TorchWork._set_status: RuntimeError "_set_status is only supported on
  Python-created work objects" for works a backend in C++ made.
- CommOptions: abort_process_on_timeout_or_error, timeout, high_priority_stream,
  store, enable_reconfigure, hints (+ name, torchcomms' earlier field).
- tensor_register / tensor_deregister(tensor) -> None
  (RegisterTensorTest: register, CPU broadcast, deregister).
- get_mem_allocator(backend) / comm.get_mem_allocator() / comm.mem_allocator.
"""
import os
import sys
from datetime import timedelta

sys.path.insert(0, os.path.dirname(__file__))
from compat_lib import Worker  # noqa: E402

import torch  # noqa: E402
import torchcomms  # noqa: E402
from torchcomms import ReduceOp, WorkStatus  # noqa: E402

w = Worker()
R, N = w.rank, w.size
T = timedelta(seconds=60)
comm = torchcomms.new_comm("cpu", torch.device("cpu"), name="contract", timeout=T,
                           hints={"contract_hint": "1"})


def parent_still_works(c, what):
    t = torch.full((4,), float(R + 1))
    comm.all_reduce(t, ReduceOp.SUM, False)
    c.eq(f"{what}: parent all_reduce", t, torch.full((4,), float(N * (N + 1) // 2)))


@w.part("split_dup_ranks")
def _(c):
    # SplitTest.test_duplicate_ranks: every rank passes the same duplicates
    with c.raises(RuntimeError, r"rank 0 appears twice in 'ranks' \(duplicate ranks found"):
        comm.split(list(range(N)) + list(range(N)), name="duplicate_comm")
    # only rank N-1 passes a duplicate: every rank fails, none waits
    bad = N - 1
    ranks = [bad, bad] if R == bad else list(range(N))
    if R == bad:
        with c.raises(RuntimeError, rf"rank {bad} appears twice in 'ranks'"):
            comm.split(ranks, "dup_one")
    else:
        with c.raises(RuntimeError, rf"rank {bad} passed an invalid 'ranks' list \(rank "
                      rf"{bad} appears twice\), so the split fails on every rank"):
            comm.split(ranks, "dup_one")
    parent_still_works(c, "after duplicates")


@w.part("split_without_caller")
def _(c):
    # SplitTest.test_rank_not_in_group: each rank leaves itself out
    with c.raises(RuntimeError, rf"'ranks' does not contain the caller's rank {R} "
                  r"\(pass an empty list to join no group\)"):
        comm.split([r for r in range(N) if r != R], name="exclude_self_comm")
    # out of range
    with c.raises(RuntimeError, rf"ranks\[1\] = {N} is out of range \[0, {N}\)"):
        comm.split([R, N], "oor")
    # only rank 0 leaves itself out; the others name everyone
    if R == 0:
        with c.raises(RuntimeError, "'ranks' does not contain the caller's rank 0"):
            comm.split(list(range(1, N)), "exclude_one")
    else:
        with c.raises(RuntimeError, r"rank 0 passed an invalid 'ranks' list \(it does not "
                      r"contain rank 0 itself\)"):
            comm.split(list(range(N)), "exclude_one")
    # members disagreeing: rank 0 lists {0, 1}, rank 1 only itself, the rest
    # join none; only rank 0 can see it, every rank is told
    ranks = {0: [0, 1], 1: [1]}.get(R, [])
    want = ("rank 1 passed a different rank list" if R == 0 else
            "rank 0 found that rank 1 passed a different rank list")
    with c.raises(RuntimeError, want):
        comm.split(ranks, "disagree")
    parent_still_works(c, "after refused lists")


@w.part("split_valid_and_none")
def _(c):
    half = max(1, N // 2)
    ranks = list(range(half)) if R < half else []
    sub = comm.split(ranks, name="contiguous_split_comm", hints={"sub": "2"},
                     timeout=timedelta(seconds=30))
    if R >= half:
        c.true("non-member gets None", sub is None)
        return
    c.true("member gets a TorchComm", isinstance(sub, torchcomms.TorchComm))
    c.eq("sub rank", sub.get_rank(), R)
    c.eq("sub size", sub.get_size(), half)
    o = sub.get_options()
    c.eq("sub options name", o.name, "contiguous_split_comm")
    c.eq("sub options hints (the split's replace the parent's)", o.hints, {"sub": "2"})
    c.eq("sub options timeout (inherited)", o.timeout, T)
    t = torch.ones(10) * float(R + 1)
    sub.all_reduce(t, ReduceOp.SUM, False)
    c.eq("sub all_reduce", t, torch.full((10,), float(half * (half + 1) // 2)))
    sub.finalize()


@w.part("wait_blocking")
def _(c):
    tensor = torch.ones(4) * (R + 1)
    work = comm.all_reduce(tensor, ReduceOp.SUM, True)
    with c.raises(RuntimeError, r"^\[TorchWork\]: waitBlocking not implemented for this "
                  "work type"):
        work.wait_blocking()
    work.wait()  # still waits for the operation
    c.true("is_completed after wait", work.is_completed())
    c.eq("status after wait", work.status(), WorkStatus.COMPLETED)
    c.eq("value", tensor, torch.full((4,), float(N * (N + 1) // 2)))
    sync = comm.barrier(False)
    with c.raises(RuntimeError, "waitBlocking not implemented"):
        sync.wait_blocking()
    c.true("sync work completed", sync.is_completed())


@w.part("set_status")
def _(c):
    work = comm.all_reduce(torch.ones(2), ReduceOp.SUM, True)
    with c.raises(RuntimeError, "^_set_status is only supported on Python-created work "
                  "objects"):
        work._set_status(WorkStatus.ERROR)
    with c.raises(RuntimeError, "only supported on Python-created"):
        work._set_status(status=WorkStatus.COMPLETED)
    with c.raises(TypeError, "argument 'status' must be a WorkStatus, not int"):
        work._set_status(3)
    work.wait()
    c.eq("status unchanged by the refused _set_status", work.status(), WorkStatus.COMPLETED)


@w.part("comm_options")
def _(c):
    d = torchcomms.CommOptions()
    c.eq("CommOptions() fields", sorted(d.__slots__),
         sorted(["abort_process_on_timeout_or_error", "timeout", "high_priority_stream",
                 "store", "enable_reconfigure", "hints", "name"]))
    c.eq("CommOptions().name", d.name, "")
    c.eq("CommOptions().timeout", d.timeout, timedelta(seconds=600))
    c.eq("CommOptions().hints", d.hints, {})
    c.true("CommOptions().store is None", d.store is None)
    d.name = "x"
    c.eq("CommOptions.name is writable", d.name, "x")
    o = comm.get_options()
    c.true("get_options is a CommOptions", isinstance(o, torchcomms.CommOptions))
    c.eq("get_options().name", o.name, "contract")
    c.eq("get_options().timeout", o.timeout, T)
    c.eq("get_options().hints", o.hints, {"contract_hint": "1"})
    c.eq("get_options().abort_process_on_timeout_or_error",
         o.abort_process_on_timeout_or_error, False)
    c.eq("get_options().high_priority_stream", o.high_priority_stream, False)
    c.eq("get_options().enable_reconfigure", o.enable_reconfigure, False)
    c.true("get_options().store is None (bootstrapped from the environment)",
           o.store is None)
    # every option given explicitly, torchcomms' argument order: name third
    store = torch.distributed.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                       N, False, timeout=T)
    pstore = torch.distributed.PrefixStore("contract_opts", store)
    c2 = torchcomms.new_comm("cpu", torch.device("cpu"), "opts_comm",
                             abort_process_on_timeout_or_error=False,
                             timeout=timedelta(seconds=45), high_priority_stream=True,
                             store=pstore, enable_reconfigure=False,
                             hints={"a": "b", "c": "d"})
    o2 = c2.get_options()
    c.eq("explicit: name", o2.name, "opts_comm")
    c.eq("explicit: timeout", o2.timeout, timedelta(seconds=45))
    c.eq("explicit: high_priority_stream", o2.high_priority_stream, True)
    c.true("explicit: store is the one given", o2.store is pstore)
    c.eq("explicit: hints", o2.hints, {"a": "b", "c": "d"})
    c.eq("explicit: abort", o2.abort_process_on_timeout_or_error, False)
    c2.set_timeout(timedelta(seconds=12))
    c.eq("set_timeout shows in get_options", c2.get_options().timeout, timedelta(seconds=12))
    c2.finalize()


@w.part("set_hints")
def _(c):
    c2 = torchcomms.new_comm("cpu", torch.device("cpu"), "hints_comm", timeout=T,
                             hints={"a": "1", "b": "2"})
    c2.set_hints({"b": "3", "c": "4"})
    c.eq("get_options().hints after set_hints", c2.get_options().hints,
         {"a": "1", "b": "3", "c": "4"})
    c2.set_hints({})
    c.eq("an empty dict changes nothing", c2.get_options().hints,
         {"a": "1", "b": "3", "c": "4"})
    with c.raises(TypeError, "set_hints: argument 'hints' must map str to str"):
        c2.set_hints({"d": 5})
    with c.raises(TypeError, "not None"):
        c2.set_hints(None)
    child = c2.split(list(range(N)), "hints_child")
    c.eq("a split without hints inherits them", child.get_options().hints,
         {"a": "1", "b": "3", "c": "4"})
    t = torch.ones(2)
    child.all_reduce(t, ReduceOp.SUM, False)
    c.eq("the child works", t, torch.full((2,), float(N)))
    child.finalize()
    c2.finalize()


@w.part("tensor_register")
def _(c):
    # RegisterTensorTest._cpu_broadcast_with_tensor_register
    for count in (4, 1024, 1 << 16):
        for dtype in (torch.float, torch.int, torch.int8):
            t = (torch.ones(count, dtype=dtype) * 99 if R == 0
                 else torch.zeros(count, dtype=dtype))
            r = comm.tensor_register(t)
            c.true("tensor_register returns None", r is None)
            try:
                work = comm.broadcast(t, 0, False)
                c.true("sync broadcast completed", work.is_completed())
                c.eq(f"broadcast {count} {dtype}", t, torch.ones(count, dtype=dtype) * 99)
            finally:
                c.true("tensor_deregister returns None", comm.tensor_deregister(t) is None)
    c.eq("nothing left registered", comm._registered(), {})
    t = torch.zeros(8)
    comm.tensor_register(t)
    comm.tensor_register(t)
    c.eq("registered twice", comm._registered(), {t.data_ptr(): (32, 2)})
    comm.tensor_deregister(t)
    comm.tensor_deregister(t)
    with c.raises(RuntimeError, rf"tensor_deregister on 'contract' \(rank {R} of {N}\): the "
                  r"tensor's memory \(32 bytes at 0x[0-9a-f]+\) was not registered"):
        comm.tensor_deregister(t)
    with c.raises(TypeError, "tensor_register: argument 'tensor' must be a torch.Tensor"):
        comm.tensor_register([1, 2])
    with c.raises(ValueError, "tensor_register: argument 'tensor' must be contiguous"):
        comm.tensor_register(torch.zeros(4, 4).t())
    with c.raises(TypeError, "tensor_register"):
        comm.tensor_register()


@w.part("mem_allocator")
def _(c):
    a = torchcomms.get_mem_allocator("cpu")
    c.true("one allocator per backend (module function)", a is torchcomms.get_mem_allocator("cpu"))
    c.true("method", comm.get_mem_allocator() is a)
    c.true("property", comm.mem_allocator is a)
    c.true("c10d names on CPU", torchcomms.get_mem_allocator("gloo") is a)
    c.eq("backend", a.backend, "cpu")
    c.eq("device", a.device, torch.device("cpu"))
    c.true("a MemAllocator", isinstance(a, torchcomms.MemAllocator))
    t = a.empty((3, 5), dtype=torch.float64)
    c.eq("shape", tuple(t.shape), (3, 5))
    c.eq("dtype", t.dtype, torch.float64)
    c.eq("zero-filled", t, torch.zeros(3, 5, dtype=torch.float64))
    c.eq("page-aligned", t.data_ptr() % 4096, 0)
    c.eq("default dtype", a.empty(4).dtype, torch.get_default_dtype())
    c.eq("empty size", tuple(a.empty([2, 0]).shape), (2, 0))
    # usable: registered and communicated
    buf = a.empty(1024, dtype=torch.int32)
    buf.fill_(R + 1)
    comm.tensor_register(buf)
    comm.all_reduce(buf, ReduceOp.SUM, False)
    comm.tensor_deregister(buf)
    c.eq("all_reduce on allocator memory", buf,
         torch.full((1024,), N * (N + 1) // 2, dtype=torch.int32))
    view = buf[10:20]
    del buf
    c.eq("memory lives as long as a view", view,
         torch.full((10,), N * (N + 1) // 2, dtype=torch.int32))
    with c.raises(RuntimeError, "No allocator factory registered for backend: nccl"):
        torchcomms.get_mem_allocator("nccl")
    with c.raises(ValueError, r"argument 'size\[0\]' = -1 is negative"):
        a.empty(-1)
    with c.raises(TypeError, "argument 'dtype' must be a torch.dtype"):
        a.empty(3, dtype="float")


@w.part("surface")
def _(c):
    """Every name of torchcomms' _comms.pyi in this area, with its keywords."""
    for name in ("new_comm", "TorchComm", "TorchWork", "CommOptions", "WorkStatus",
                 "RedOpType", "ReduceOp", "P2POpType", "P2POp", "BatchSendRecv",
                 "get_mem_allocator", "SendOptions", "RecvOptions", "BatchP2POptions",
                 "BroadcastOptions", "AllReduceOptions", "ReduceOptions",
                 "AllGatherOptions", "AllGatherSingleOptions", "ReduceScatterOptions",
                 "ReduceScatterSingleOptions", "AllToAllOptions", "AllToAllSingleOptions",
                 "AllToAllvSingleOptions", "BarrierOptions", "ScatterOptions",
                 "GatherOptions"):
        c.true(f"torchcomms.{name}", hasattr(torchcomms, name))
    for name in ("finalize", "get_rank", "get_size", "get_name", "get_options",
                 "get_device", "get_backend", "get_backend_version", "abort", "is_aborted",
                 "set_timeout", "send", "recv", "broadcast", "all_reduce", "reduce",
                 "all_gather", "all_gather_v", "all_gather_single", "reduce_scatter",
                 "reduce_scatter_v", "reduce_scatter_single", "all_to_all_single",
                 "all_to_all_v_single", "all_to_all", "barrier", "scatter", "gather",
                 "gather_single", "split", "batch_op_create", "get_mem_allocator",
                 "mem_allocator", "register_pre_hook", "register_post_hook",
                 "register_abort_hook", "tensor_register", "tensor_deregister"):
        c.true(f"TorchComm.{name}", hasattr(torchcomms.TorchComm, name))
    for name in ("is_completed", "wait", "wait_blocking", "_set_status"):
        c.true(f"TorchWork.{name}", hasattr(torchcomms.TorchWork, name))
    c.eq("WorkStatus members", [m.name for m in WorkStatus],
         ["NOT_STARTED", "INPROGRESS", "COMPLETED", "TIMEDOUT", "ERROR"])
    # keywords as torchcomms names them
    t = torch.ones(2)
    comm.all_reduce(tensor=t, op=ReduceOp.SUM, async_op=False, hints=None, timeout=None)
    c.eq("all_reduce by keyword", t, torch.full((2,), float(N)))
    none = comm.split(ranks=[], name="kw_split", hints=None, timeout=None)
    c.true("split by keyword", none is None)
    comm.tensor_register(tensor=t)
    comm.tensor_deregister(tensor=t)
    c.true("get_mem_allocator(backend=)", torchcomms.get_mem_allocator(backend="cpu")
           is comm.get_mem_allocator())


comm.barrier(False)
comm.finalize()
sys.exit(w.finish())
