#!/usr/bin/env python3
"""One-sided windows from Python on real processes (launched by
tests/py/test_windows_py.py, one process per rank):

    python windows_worker.py MODE RANK N PORT

MODE parts: every part below, on a communicator of N ranks over the cpu
backend (the transport: TORCHCOMMS_CPU_TRANSPORT of the test's pass);
MODE dead: rank N-1 SIGKILLs itself while the others wait_signal on it.
The test hosts a torch TCPStore on PORT (it outlives every worker); each
rank writes its result as JSON to the store key "result/<RANK>":
{"errors": [...], "parts": [...], "data": {...}}.

Parts (every value checked exactly, on every rank):
- random: every rank puts into every other rank's window (regions of
  seeded random offsets and sizes; every rank's window has its own size),
  signals it, waits for every peer's signal, then checks its own
  registered tensor (which was moved onto the window memory) and its
  map_remote_tensor(own rank); after a barrier (a fence in round 1), gets
  of random regions of every window. Three rounds: sync, async, sync.
- rma: torchcomms' WindowRmaTest pattern: put to the next rank, signal it,
  wait for the previous, 10 iterations, async and sync put and signal, for
  float32, int32, int8 and bfloat16, 4 and 1024 elements (and 64 Ki
  float32) (values change every iteration; the
  window has one slot per iteration modulo N, so that a previous rank
  running ahead never overwrites a slot still being read).
- map: get_attr and map_remote_tensor: over shared memory every peer is
  WIN_ACCESS_TYPE_UNIFIED and its window a tensor here (reads what it
  wrote, writes land in its tensor, the mapping outlives
  tensor_deregister); over TCP peers are WIN_ACCESS_TYPE_SEPARATE and
  mapping one raises RuntimeError.
- async_wait: an async wait_signal's TorchWork is not complete until the
  peer signals.
- fence: puts without signals, then fence (ours): every put is in place.
- misuse: double register, deregister without register, operations before
  registering, a put beyond the target's window (the target's memory is
  unchanged), bad ranks, negative offsets, a non-contiguous tensor, another
  dtype, GPU-only methods, types of arguments.
- hooks: new_window runs the pre and post hooks (OpName.new_window), and
  new_window(tensor) registers at once.
"""

import json
import os
import random
import signal
import sys
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

import torchcomms
from torchcomms import OpName, TorchCommWinAccessType as Access

MODE, RANK, N, PORT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
TCP = os.environ.get("TORCHCOMMS_CPU_TRANSPORT") == "tcp"
store = dist.TCPStore("127.0.0.1", PORT, is_master=False, timeout=timedelta(seconds=60))
ERRORS, PARTS, DATA = [], [], {}
PART = [""]


def fail(msg):
    ERRORS.append(f"[{PART[0]}] {msg}")


def eq(what, got, exp):
    if isinstance(got, torch.Tensor) or isinstance(exp, torch.Tensor):
        ok = (isinstance(got, torch.Tensor) and isinstance(exp, torch.Tensor)
              and got.dtype == exp.dtype and got.shape == exp.shape
              and bool(torch.equal(got, exp)))
        if not ok and isinstance(got, torch.Tensor) and got.shape == exp.shape:
            bad = (got != exp).nonzero().flatten().tolist()[:5]
            fail(f"{what}: differs at {bad}: got {got.flatten()[bad[:1]].tolist() if bad else []}"
                 f" expected {exp.flatten()[bad[:1]].tolist() if bad else []}"
                 f" ({got.dtype}/{exp.dtype})")
            return False
    else:
        ok = got == exp
    if not ok:
        fail(f"{what}: got {got!r} expected {exp!r}")
    return ok


def true(what, cond):
    if not cond:
        fail(what)
    return cond


def raises(what, exc, text, fn):
    try:
        fn()
    except exc as e:
        if text not in str(e):
            fail(f"{what}: {type(e).__name__} without {text!r}: {e}")
        return str(e)
    except Exception as e:  # noqa: BLE001
        fail(f"{what}: expected {exc.__name__}, got {type(e).__name__}: {e}")
        return None
    fail(f"{what}: expected {exc.__name__} ({text!r}), nothing raised")
    return None


def run_part(name, fn, comm):
    PART[0] = name
    try:
        fn(comm)
        PARTS.append(name)
    except Exception:  # noqa: BLE001
        fail("raised:\n" + traceback.format_exc())
    # every part ends in step on every rank (a failed part still pairs)
    comm.barrier(False)


def done(comm=None):
    store.set(f"result/{RANK}", json.dumps({"errors": ERRORS, "parts": PARTS, "data": DATA}))


# ---- parts ---------------------------------------------------------------

def part_random(comm):
    others = [p for p in range(N) if p != RANK]
    sizes = [600 + 97 * p for p in range(N)]  # elements of each rank's window
    for rnd, async_op in enumerate((False, True, False)):
        rng = random.Random(1000 + rnd)  # the same plan on every rank
        plan = {}  # (origin, target) -> (offset, length): in slot `origin` of the target
        for t in range(N):
            slot = sizes[t] // N
            for o in range(N):
                if o != t:
                    a = rng.randrange(0, slot)
                    plan[(o, t)] = (slot * o + a, rng.randrange(1, slot - a + 1))

        def values(o, t, length):
            return (torch.arange(length, dtype=torch.int32) + o * 1_000_000 + t * 10_000
                    + rnd * 1000)

        def expected(t):
            e = torch.full((sizes[t],), -1 - rnd, dtype=torch.int32)
            for o in range(N):
                if o != t:
                    off, length = plan[(o, t)]
                    e[off:off + length] = values(o, t, length)
            return e

        buf = torch.full((sizes[RANK],), -1 - rnd, dtype=torch.int32)
        win = comm.new_window()
        win.tensor_register(buf)
        eq("get_size", win.get_size(), sizes[RANK] * 4)
        eq("dtype/shape", (win.dtype, win.shape), (torch.int32, [sizes[RANK]]))
        order = others[:]
        random.Random(RANK + 10 * rnd).shuffle(order)
        for t in order:
            off, length = plan[(RANK, t)]
            src = values(RANK, t, length)
            if length > 1 and rnd == 2:  # two puts for one region
                h = length // 2
                win.put(src[:h], t, off, False)
                w = win.put(src[h:], t, off + h, True)
                w.wait()
            else:
                w = win.put(src, t, off, async_op)
                if async_op:
                    w.wait()
        for t in order:
            w = win.signal(t, async_op)
            if async_op:
                w.wait()
        for p in others:
            w = win.wait_signal(p, async_op)
            if async_op:
                w.wait()
        exp = expected(RANK)
        eq(f"round {rnd}: the registered tensor", buf, exp)
        eq(f"round {rnd}: map_remote_tensor(own rank)", win.map_remote_tensor(RANK), exp)
        eq(f"round {rnd}: get_tensor is the tensor", win.get_tensor() is buf, True)
        if rnd == 1:
            win.fence()  # every window is complete (ours: MPI_Win_fence)
        else:
            comm.barrier(False)  # every window is complete (the waits above)
        for p in range(N):
            e = expected(p)
            off = rng.randrange(0, sizes[p])
            length = rng.randrange(1, sizes[p] - off + 1)
            dst = torch.zeros(length, dtype=torch.int32)
            w = win.get(dst, p, off, async_op)
            if async_op:
                w.wait()
            eq(f"round {rnd}: get {length} from rank {p} at {off}", dst, e[off:off + length])
        comm.barrier(False)  # nobody deregisters under a get
        win.tensor_deregister()
        eq(f"round {rnd}: the tensor keeps its values after deregister", buf, exp)
        eq("get_size after deregister", win.get_size(), 0)


def part_rma(comm):
    nxt, prv = (RANK + 1) % N, (RANK - 1) % N
    cases = [(dtype, count, a, s) for dtype in (torch.float32, torch.int32, torch.int8,
                                                torch.bfloat16)
             for count in (4, 1024) for a, s in ((False, False), (True, True), (True, False),
                                                 (False, True))]
    cases.append((torch.float32, 1 << 16, True, True))  # 256 KiB puts
    for dtype, count, async_op, async_signal in cases:
        win_buf = torch.ones(N * N * count, dtype=dtype)
        win = comm.new_window()
        win.tensor_register(win_buf)
        comm.barrier(False)
        for it in range(10):
            slot = it % N  # slot `it % N`, region `rank`
            src = torch.ones(count, dtype=dtype) * (RANK + it * N)
            w = win.put(src, nxt, (slot * N + nxt) * count, async_op)
            if async_op:
                w.wait()
            w = win.signal(nxt, async_signal)
            if async_signal:
                w.wait()
            w = win.wait_signal(prv, async_signal)
            if async_signal:
                w.wait()
            local = win.map_remote_tensor(RANK)
            lo = (slot * N + RANK) * count
            exp = torch.ones(count, dtype=dtype) * (prv + it * N)
            what = f"{dtype} count {count} async {async_op}/{async_signal} it {it}"
            if not eq(what + " (map_remote_tensor(own))", local[lo:lo + count], exp):
                break
            eq(what + " (the registered tensor)", win_buf[lo:lo + count], exp)
        comm.barrier(False)
        win.tensor_deregister()


def part_map(comm):
    count = 64
    buf = torch.arange(count * N, dtype=torch.float32) + 1000 * RANK
    win = comm.new_window()
    win.tensor_register(buf)
    comm.barrier(False)
    own = win.map_remote_tensor(RANK)
    eq("own map aliases the registered tensor", own.data_ptr(), buf.data_ptr())
    eq("own access", win.get_attr(RANK).access_type, Access.WIN_ACCESS_TYPE_UNIFIED)
    nxt = (RANK + 1) % N
    if TCP:
        for p in range(N):
            if p != RANK:
                eq(f"access of rank {p} over TCP", win.get_attr(p).access_type,
                   Access.WIN_ACCESS_TYPE_SEPARATE)
                raises(f"map_remote_tensor({p}) over TCP", RuntimeError,
                       f"rank {p}'s window cannot be mapped into this process", 
                       lambda p=p: win.map_remote_tensor(p))
        comm.barrier(False)
        win.tensor_deregister()
        return
    maps = {}
    for p in range(N):
        eq(f"access of rank {p}", win.get_attr(p).access_type, Access.WIN_ACCESS_TYPE_UNIFIED)
        m = win.map_remote_tensor(p)
        eq(f"rank {p}'s window mapped", m, torch.arange(count * N, dtype=torch.float32) + 1000 * p)
        maps[p] = m
    comm.barrier(False)  # everyone has read before anyone writes
    # store into the next rank's window through the mapping, region RANK
    maps[nxt][RANK * count:(RANK + 1) * count] = -1.0 - RANK
    comm.barrier(False)
    prv = (RANK - 1) % N
    exp = torch.arange(count * N, dtype=torch.float32) + 1000 * RANK
    exp[prv * count:(prv + 1) * count] = -1.0 - prv
    eq("the previous rank's stores, in the registered tensor", buf, exp)
    comm.barrier(False)
    win.tensor_deregister()
    # mappings outlive the window
    exp_n = torch.arange(count * N, dtype=torch.float32) + 1000 * nxt
    exp_n[RANK * count:(RANK + 1) * count] = -1.0 - RANK
    eq("the next rank's mapping after tensor_deregister", maps[nxt], exp_n)
    DATA["map_outlives"] = True


def part_async_wait(comm):
    if N < 2:
        return
    buf = torch.zeros(4, dtype=torch.int32)
    win = comm.new_window(buf)
    if RANK == 0:
        w = win.wait_signal(1, True)
        eq("async wait_signal before the signal: not complete", w.is_completed(), False)
        comm.barrier(False)
        w.wait()
        eq("after wait", w.is_completed(), True)
        eq("the put before the signal is there", buf, torch.tensor([0, 7, 7, 0], dtype=torch.int32))
    elif RANK == 1:
        comm.barrier(False)
        win.put(torch.tensor([7, 7], dtype=torch.int32), 0, 1, False)
        win.signal(0, False)
    else:
        comm.barrier(False)
    comm.barrier(False)
    win.tensor_deregister()


def part_fence(comm):
    """Puts without signals, then fence (ours, MPI_Win_fence): every put is
    in place everywhere."""
    buf = torch.full((N * 8,), -1, dtype=torch.int64)
    win = comm.new_window(buf)
    for it in range(3):
        for p in range(N):
            if p != RANK:
                win.put(torch.arange(8, dtype=torch.int64) + 100 * RANK + 10_000 * it, p,
                        RANK * 8, it == 1)
        win.fence()
        exp = torch.cat([torch.arange(8, dtype=torch.int64) + 100 * o + 10_000 * it
                         if o != RANK else torch.full((8,), -1, dtype=torch.int64)
                         for o in range(N)])
        eq(f"iteration {it}: after the fence", buf, exp)
        win.fence()  # everyone has looked before the next puts
    win.tensor_deregister()


def part_misuse(comm):
    nxt = (RANK + 1) % N
    win = comm.new_window()
    eq("no tensor: get_size", win.get_size(), 0)
    eq("no tensor: get_tensor", win.get_tensor(), None)
    eq("no tensor: dtype and shape", (win.dtype, win.shape), (torch.float32, []))
    for name, fn in (("put", lambda: win.put(torch.ones(1), nxt, 0, False)),
                     ("signal", lambda: win.signal(nxt, False)),
                     ("wait_signal", lambda: win.wait_signal(nxt, False)),
                     ("map_remote_tensor", lambda: win.map_remote_tensor(nxt)),
                     ("get_attr", lambda: win.get_attr(nxt))):
        raises(f"{name} before tensor_register", RuntimeError,
               "no tensor is registered with this window (call tensor_register", fn)
    raises("tensor_deregister without register", RuntimeError,
           "Double deregistration error", win.tensor_deregister)
    raises("non-contiguous tensor_register", RuntimeError, "must be contiguous",
           lambda: win.tensor_register(torch.ones(4, 4)[:, 0]))
    buf = torch.arange(16, dtype=torch.float32) + 100 * RANK
    win.tensor_register(buf)
    raises("double register", RuntimeError, "Double registration error",
           lambda: win.tensor_register(torch.ones(2)))
    prefix = f"TorchCommWindow.put on '{comm.get_name()}' (rank {RANK} of {N}): "
    msg = raises("put beyond the window", RuntimeError, prefix + "Requested size",
                 lambda: win.put(torch.full((5,), -9.0), nxt, 12, False))
    if msg is not None:
        true(f"the message names the target's size: {msg}",
             f"exceeds the window size of rank {nxt} (64 bytes)" in msg)
    raises("put of more than the window", RuntimeError, "Requested size",
           lambda: win.put(torch.full((17,), -9.0), nxt, 0, True))
    raises("get beyond the window", RuntimeError, "Requested size",
           lambda: win.get(torch.zeros(2), nxt, 15, False))
    for bad in (N, -1):
        raises(f"put to rank {bad}", RuntimeError,
               f"argument 'dst_rank' = {bad} is not a rank of the communicator", 
               lambda bad=bad: win.put(torch.ones(1), bad, 0, False))
        raises(f"signal to rank {bad}", RuntimeError, "is not a rank of the communicator",
               lambda bad=bad: win.signal(bad, False))
        raises(f"wait_signal on rank {bad}", RuntimeError, "is not a rank of the communicator",
               lambda bad=bad: win.wait_signal(bad, False))
        raises(f"map_remote_tensor({bad})", RuntimeError, "is not a rank of the communicator",
               lambda bad=bad: win.map_remote_tensor(bad))
        raises(f"get_attr({bad})", RuntimeError, "is not a rank of the communicator",
               lambda bad=bad: win.get_attr(bad))
    raises("negative offset", RuntimeError, "argument 'target_offset_nelems' = -1 is negative",
           lambda: win.put(torch.ones(1), nxt, -1, False))
    raises("non-contiguous put", RuntimeError, "must be contiguous",
           lambda: win.put(torch.ones(4, 4)[:, 0], nxt, 0, False))
    raises("put of another dtype", RuntimeError,
           "argument 'tensor' has dtype int32 but the window holds float32",
           lambda: win.put(torch.ones(2, dtype=torch.int32), nxt, 0, False))
    raises("get into another dtype", RuntimeError, "has dtype float64 but the window holds",
           lambda: win.get(torch.ones(2, dtype=torch.float64), nxt, 0, False))
    raises("a str rank", TypeError, "must be an int", lambda: win.put(torch.ones(1), "1", 0, False))
    raises("a float offset", TypeError, "must be an int",
           lambda: win.put(torch.ones(1), nxt, 1.5, False))
    raises("a list tensor", TypeError, "must be a torch.Tensor",
           lambda: win.put([1.0], nxt, 0, False))
    for name, fn in (("get_device_window", win.get_device_window),
                     ("register_local_buffer", lambda: win.register_local_buffer(torch.ones(1))),
                     ("deregister_local_buffer", lambda: win.deregister_local_buffer(None))):
        raises(name, RuntimeError, "device windows are GPU-only", fn)
    comm.barrier(False)  # every refused put was issued
    eq("nothing of the refused puts landed", buf, torch.arange(16, dtype=torch.float32) + 100 * RANK)
    comm.barrier(False)  # everyone has looked before the next put
    # a put that exactly fits is fine
    win.put(torch.full((4,), -1.0), nxt, 12, False)
    win.signal(nxt, False)
    win.wait_signal((RANK - 1) % N, False)
    exp = torch.arange(16, dtype=torch.float32) + 100 * RANK
    exp[12:] = -1.0
    eq("a put up to the window's end", buf, exp)
    comm.barrier(False)
    win.tensor_deregister()
    raises("second deregister", RuntimeError, "Double deregistration error",
           win.tensor_deregister)
    # register again after deregister: a new window
    win.tensor_register(torch.zeros(3, dtype=torch.int8))
    eq("re-registered size", win.get_size(), 3)
    win.tensor_deregister()


def part_hooks(comm):
    events = []
    pre = comm.register_pre_hook(lambda name, op_id, args: events.append(("pre", name, op_id,
                                                                          type(args).__name__)))
    post = comm.register_post_hook(lambda op_id, args: events.append(("post", op_id,
                                                                      type(args).__name__)))
    buf = torch.full((5,), float(RANK))
    win = comm.new_window(buf)
    pre.remove()
    post.remove()
    true(f"hook events {events}", len(events) == 2 and events[0][:2] == ("pre", OpName.new_window)
         and events[0][3] == "NewWindowPreHookArgs" and events[1][0] == "post"
         and events[1][1] == events[0][2] and events[1][2] == "NewWindowPostHookArgs")
    eq("new_window(tensor) registered it", (win.get_size(), win.get_tensor() is buf), (20, True))
    comm.barrier(False)
    win.tensor_deregister()


PARTS_ALL = [("random", part_random), ("rma", part_rma), ("map", part_map),
             ("async_wait", part_async_wait), ("fence", part_fence), ("misuse", part_misuse),
             ("hooks", part_hooks)]


def main_parts():
    comm = torchcomms.new_comm("cpu", torch.device("cpu"), name="win", rank=RANK, size=N,
                               store=store, timeout=timedelta(seconds=60))
    t0 = time.monotonic()
    for name, fn in PARTS_ALL:
        t1 = time.monotonic()
        run_part(name, fn, comm)
        DATA[f"{name}_s"] = round(time.monotonic() - t1, 3)
    DATA["total_s"] = round(time.monotonic() - t0, 3)
    comm.finalize()


def main_dead():
    """The survivors post an asynchronous wait_signal on the victim, then tell
    it (through the store) to die; the wait fails naming it. Later a
    synchronous wait_signal, a put, a get and a signal to it fail too."""
    victim = N - 1
    comm = torchcomms.new_comm("cpu", torch.device("cpu"), name="dead", rank=RANK, size=N,
                               store=store, timeout=timedelta(seconds=60))
    buf = torch.zeros(256, dtype=torch.float32)
    win = comm.new_window(buf)
    comm.barrier(False)
    if RANK == victim:
        store.wait(["waiting_all"], timedelta(seconds=60))
        os.kill(os.getpid(), signal.SIGKILL)
    PART[0] = "dead"
    w = win.wait_signal(victim, True)
    if store.add("waiting", 1) == N - 1:
        store.set("waiting_all", "1")
    t0 = time.monotonic()
    try:
        w.wait()
        fail("an asynchronous wait_signal on a dead peer completed")
    except RuntimeError as e:
        DATA["error"] = str(e)
    DATA["elapsed_s"] = round(time.monotonic() - t0, 3)
    later = {}
    for name, fn in (("wait_signal", lambda: win.wait_signal(victim, False)),
                     ("put", lambda: win.put(torch.ones(4), victim, 0, False)),
                     ("get", lambda: win.get(torch.ones(4), victim, 0, False)),
                     ("signal", lambda: win.signal(victim, False))):
        t1 = time.monotonic()
        try:
            fn()
            later[name] = "no error"
        except RuntimeError as e:
            later[name] = str(e)
        if time.monotonic() - t1 > 10:
            fail(f"{name} to the dead peer took {time.monotonic() - t1:.1f} s")
    DATA["later"] = later
    PARTS.append("dead")
    comm.abort()
    win.tensor_deregister()  # the communicator is down: no barrier
    DATA["deregistered"] = True


try:
    if MODE == "dead":
        main_dead()
    else:
        main_parts()
except Exception:  # noqa: BLE001
    fail("main raised:\n" + traceback.format_exc())
done()
