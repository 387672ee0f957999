#!/usr/bin/env python3
"""Every TorchComm operation on the nccl backend, checked exactly.

Two uses:

- without a GPU (tests/py/test_nccl_fake.py): the fake NCCL and CUDA
  runtime of tests/c/fake_nccl/ (TORCHCOMMS_NCCL_LIB, TORCHCOMMS_CUDART_LIB)
  and the test-only switch TORCHCOMMS_NCCL_FAKE_HOST=1, on CPU tensors:

      torchrun --standalone --nproc_per_node=2 tests/py/workers/nccl_worker.py cpu

- on a real GPU (tests/gpu/run.sh), on CUDA tensors, the extension passing
  torch's current stream to every operation:

      torchrun --standalone --nproc_per_node=1 tests/py/workers/nccl_worker.py cuda

Every rank runs the same cases in the same order, compares each result with
a value computed locally (small integers: exact in every dtype and order),
prints "nccl worker rank R of N: K checks passed" and exits 0, or prints
every failure and exits 1.
"""

import os
import sys
from datetime import timedelta

import torch

from torchcomms import ReduceOp, new_comm

FAILURES = []
CHECKS = [0]


def check(what, got, expected):
    CHECKS[0] += 1
    got = got.cpu()
    expected = expected.cpu().to(got.dtype)
    if got.shape != expected.shape or not torch.equal(got, expected):
        FAILURES.append(f"{what}: got {got.tolist()} expected {expected.tolist()}")


def main() -> int:
    kind = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    if kind == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    comm = new_comm("nccl", device, name="nccl_py", timeout=timedelta(seconds=60))
    assert comm.get_backend() == "nccl", comm.get_backend()
    r, n = comm.get_rank(), comm.get_size()

    def full(count, value, dtype=torch.float32):
        return torch.full((count,), value, dtype=dtype, device=device)

    def rng(count, base, dtype=torch.float32):
        return (torch.arange(count, device=device) + base).to(dtype)

    total = n * (n + 1) // 2
    floats = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
    ints = (torch.int8, torch.uint8, torch.int32, torch.int64)
    for dt in floats + ints:
        for op, expect in ((ReduceOp.SUM, total), (ReduceOp.MAX, n),
                           (ReduceOp.MIN, 1), (ReduceOp.PRODUCT, None)):
            t = full(5, r + 1, dt)
            comm.all_reduce(t, op, async_op=False)
            if expect is None:
                expect = 1
                for k in range(1, n + 1):
                    expect *= k
            check(f"all_reduce {op} {dt}", t, full(5, expect, dt))
        t = full(3, r + 1, dt)
        comm.all_reduce(t, ReduceOp.AVG)
        avg = total / n if dt in floats else total // n
        check(f"all_reduce AVG {dt}", t, full(3, avg, dt))
        if dt in floats:
            t = full(3, r + 1, dt)
            comm.all_reduce(t, ReduceOp.PREMUL_SUM(2.0))
            check(f"all_reduce PREMUL_SUM(2) {dt}", t, full(3, 2 * total, dt))
    b = torch.tensor([r == 0, True, False], device=device)
    comm.all_reduce(b, ReduceOp.SUM)  # logical or
    check("all_reduce bool SUM", b, torch.tensor([True, True, False]))
    b = torch.tensor([r == 0, True, False], device=device)
    comm.all_reduce(b, ReduceOp.PRODUCT)  # logical and
    check("all_reduce bool PRODUCT", b, torch.tensor([n == 1, True, False]))

    # asynchronous: the tensor is kept alive, wait() orders what follows
    t = full(1000, r + 1)
    work = comm.all_reduce(t, ReduceOp.SUM, async_op=True)
    work.wait()
    check("async all_reduce", t, full(1000, total))

    t = full(4, r) if r == n - 1 else full(4, -1)
    comm.broadcast(t, n - 1)
    check("broadcast", t, full(4, n - 1))
    t = full(4, r + 1)
    comm.reduce(t, 0, ReduceOp.SUM)
    check("reduce", t, full(4, total) if r == 0 else full(4, r + 1))

    out = [full(3, -1) for _ in range(n)]
    comm.all_gather(out, full(3, r))
    for i in range(n):
        check(f"all_gather [{i}]", out[i], full(3, i))
    out = full(3 * n, -1)
    comm.all_gather_single(out, full(3, r))
    check("all_gather_single", out, torch.arange(n).repeat_interleave(3).float())
    out = [full(i + 1, -1) for i in range(n)]
    comm.all_gather_v(out, full(r + 1, r))
    for i in range(n):
        check(f"all_gather_v [{i}]", out[i], full(i + 1, i))

    out = full(2, -1)
    comm.reduce_scatter(out, [full(2, r + j) for j in range(n)], ReduceOp.SUM)
    check("reduce_scatter", out, full(2, total - n + n * r))
    out = full(2, -1)
    comm.reduce_scatter_single(out, rng(2 * n, 0), ReduceOp.SUM)
    check("reduce_scatter_single", out, rng(2, 2 * r) * n)
    out = full(r + 1, -1)
    comm.reduce_scatter_v(out, [full(j + 1, 1) for j in range(n)], ReduceOp.SUM)
    check("reduce_scatter_v", out, full(r + 1, n))

    out = full(2 * n, -1)
    comm.all_to_all_single(out, full(2 * n, r))
    check("all_to_all_single", out, torch.arange(n).repeat_interleave(2).float())
    ins = [i + 1 for i in range(n)]             # send i+1 rows to rank i
    outs = [r + 1] * n                          # receive r+1 rows from each
    out = full(sum(outs), -1)
    comm.all_to_all_v_single(out, full(sum(ins), r), outs, ins)
    check("all_to_all_v_single", out,
          torch.cat([full(r + 1, j) for j in range(n)]))
    out = [full(2, -1) for _ in range(n)]
    comm.all_to_all(out, [full(2, 10 * r + j) for j in range(n)])
    for j in range(n):
        check(f"all_to_all [{j}]", out[j], full(2, 10 * j + r))

    out = full(2, -1)
    comm.scatter(out, [full(2, j) for j in range(n)] if r == 0 else [], 0)
    check("scatter", out, full(2, r))
    out = [full(2, -1) for _ in range(n)] if r == n - 1 else []
    comm.gather(out, full(2, r), n - 1)
    for j in range(len(out)):
        check(f"gather [{j}]", out[j], full(2, j))
    out = full(2 * n, -1)
    comm.gather_single(out, full(2, r), 0)
    if r == 0:
        check("gather_single", out, torch.arange(n).repeat_interleave(2).float())

    if n > 1:
        right, left = (r + 1) % n, (r + n - 1) % n
        got = full(4, -1)
        if r % 2 == 0:
            ws = comm.send(full(4, r), right, async_op=True)
            wr = comm.recv(got, left, async_op=True)
        else:
            wr = comm.recv(got, left, async_op=True)
            ws = comm.send(full(4, r), right, async_op=True)
        ws.wait()
        wr.wait()
        check("send/recv", got, full(4, left))
    batch = comm.batch_op_create()
    got = [full(2, -1) for _ in range(n)]
    for j in range(n):
        batch.recv(got[j], j)
    for j in range(n):
        batch.send(full(2, 100 * r + j), j)
    batch.issue(async_op=False)
    for j in range(n):
        check(f"batch from {j}", got[j], full(2, 100 * j + r))
    comm.barrier()
    comm.barrier(async_op=True).wait()

    # several communicators: a split and a second one by name
    child = comm.split(list(range(n)), "nccl_py_child")
    other = new_comm("nccl", device, name="nccl_py_other", timeout=timedelta(seconds=60))
    t1, t2 = full(2, r + 1), full(2, 2 * (r + 1))
    w1 = child.all_reduce(t1, ReduceOp.SUM, async_op=True)
    w2 = other.all_reduce(t2, ReduceOp.SUM, async_op=True)
    comm.all_reduce(t3 := full(2, 1), ReduceOp.SUM)
    w1.wait()
    w2.wait()
    check("split child all_reduce", t1, full(2, total))
    check("second communicator all_reduce", t2, full(2, 2 * total))
    check("parent all_reduce", t3, full(2, n))
    child.finalize()
    other.finalize()

    # what NCCL cannot do is refused with a clear error, before any byte moves
    try:
        comm.all_reduce(full(2, 1, torch.int16), ReduceOp.SUM)
        FAILURES.append("int16 all_reduce was not refused")
    except RuntimeError as e:
        CHECKS[0] += 1
        if "NCCL cannot reduce dtype int16" not in str(e):
            FAILURES.append(f"int16 refusal message: {e}")
    t = full(2, 7, torch.int16)
    comm.broadcast(t, 0)  # moved as bytes
    check("int16 broadcast", t, full(2, 7, torch.int16))

    comm.finalize()
    if FAILURES:
        for f in FAILURES:
            print(f"nccl worker rank {r} of {n}: FAILED {f}", file=sys.stderr)
        return 1
    print(f"nccl worker rank {r} of {n}: {CHECKS[0]} checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
