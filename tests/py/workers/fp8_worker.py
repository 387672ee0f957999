#!/usr/bin/env python3
"""float8_e4m3fn / float8_e5m2 tensors through TorchComm on 2 ranks, checked
exactly against torch doing the same arithmetic in float32:

    torchrun --standalone --nproc_per_node=2 tests/py/workers/fp8_worker.py [cpu|nccl]

("nccl": the nccl backend over the fake NCCL of tests/c/fake_nccl/, on CPU
tensors; tests/py/test_fp8_py.py sets up its environment. There AVG and
PREMUL_SUM must be refused: NCCL has neither on float8.)

Inputs: rank 0 holds the byte values in turn (i % 256), rank 1 each byte
value 256 times in a row (i // 256 % 256), so that the first 65536 elements
pair every value of the format with every value (NaN, infinities,
saturation, subnormals, ties); then random bytes up to COUNT elements (past
the small-message paths). Every rank regenerates both inputs and computes
the reference with torch, in float32, rounded by torch's own conversion:

  SUM         (a.float() + b.float()).to(dt)
  PRODUCT     (a.float() * b.float()).to(dt)
  MIN, MAX    torch.minimum / torch.maximum of the floats, .to(dt)
  AVG         (SUM.float() / 2).to(dt): the sum is rounded first, as for
              float16 and bfloat16
  PREMUL_SUM  ((a.float() * f).to(dt).float() + (b.float() * f).to(dt).float()).to(dt)

Results are compared as bytes; two NaNs match whatever their sign and
payload (the order of the operands decides which NaN propagates), and for
MIN and MAX +0 matches -0 (either may be returned). Data movement
(broadcast, all_gather, all_gather_single) must be bit-exact, NaN payloads
included. Prints "fp8 worker rank R of N: K checks passed" and exits 0, or
prints every failure and exits 1.
"""

import sys
from datetime import timedelta

import torch

from torchcomms import ReduceOp, new_comm

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
COUNT = (1 << 20) + 3
# PREMUL_SUM's factor: exact in both formats (the nccl backend passes it to
# NCCL in the operation's dtype), not a power of two (products round)
FACTOR = 0.375
FAILURES = []
CHECKS = [0]


def inputs(rank, dt, n=COUNT):
    """Rank `rank`'s input of n elements (every rank can regenerate it)."""
    i = torch.arange(n, dtype=torch.int64)
    b = (i % 256) if rank == 0 else (i // 256 % 256)
    g = torch.Generator().manual_seed(1000 * rank + (1 if dt == E4 else 2))
    b[65536:] = torch.randint(0, 256, (max(n - 65536, 0),), generator=g)
    return b.to(torch.uint8).view(dt)


def f32(x):
    return x.float()


def reference(op, a, b, dt):
    fa, fb = f32(a), f32(b)
    if op == "SUM":
        return (fa + fb).to(dt)
    if op == "PRODUCT":
        return (fa * fb).to(dt)
    if op == "MIN":
        return torch.minimum(fa, fb).to(dt)
    if op == "MAX":
        return torch.maximum(fa, fb).to(dt)
    if op == "AVG":
        return (f32((fa + fb).to(dt)) / torch.tensor(2.0)).to(dt)
    f = torch.tensor(FACTOR, dtype=torch.float32)
    return (f32((fa * f).to(dt)) + f32((fb * f).to(dt))).to(dt)


def redop(op):
    return ReduceOp.PREMUL_SUM(FACTOR) if op == "PREMUL_SUM" else getattr(ReduceOp, op)


def check(what, got, want, op=None):
    """Bytes equal, or both NaN, or (MIN/MAX) both zero."""
    CHECKS[0] += 1
    if got.dtype != want.dtype or got.shape != want.shape:
        FAILURES.append(f"{what}: got {got.dtype} {tuple(got.shape)}, "
                        f"expected {want.dtype} {tuple(want.shape)}")
        return
    gb, wb = got.view(torch.uint8), want.view(torch.uint8)
    ok = gb == wb
    if op is not None:  # a reduction: NaN matches NaN
        gf, wf = f32(got), f32(want)
        ok |= gf.isnan() & wf.isnan()
        if op in ("MIN", "MAX"):
            ok |= (gf == 0) & (wf == 0)
    bad = (~ok).nonzero().flatten()
    if bad.numel():
        k = int(bad[0])
        FAILURES.append(f"{what}: {bad.numel()} wrong elements, first at {k}: "
                        f"got 0x{int(gb[k]):02x} ({float(f32(got[k]))}), "
                        f"expected 0x{int(wb[k]):02x} ({float(f32(want[k]))})")


def main() -> int:
    backend = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    comm = new_comm(backend, torch.device("cpu"), name="fp8_py",
                    timeout=timedelta(seconds=60))
    r, n = comm.get_rank(), comm.get_size()
    assert n == 2, f"run with 2 ranks, not {n}"
    for dt in (E4, E5):
        a, b = inputs(0, dt), inputs(1, dt)
        mine = a if r == 0 else b
        for op in ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "PREMUL_SUM"):
            if backend == "nccl" and op in ("AVG", "PREMUL_SUM"):
                # NCCL has no float8 AVG (ncclInvalidArgument on a real one)
                # and torchcomms' NCCL backend takes no float8 PREMUL_SUM:
                # refused, by name, before NCCL is called
                name = str(dt).replace("torch.", "")
                for call in (lambda: comm.all_reduce(mine[:7].clone(), redop(op), async_op=False),
                             lambda: comm.reduce_scatter_single(
                                 torch.empty(3, dtype=dt), mine[:6].clone(), redop(op),
                                 async_op=False)):
                    CHECKS[0] += 1
                    try:
                        call()
                        FAILURES.append(f"{op} {dt} on nccl: not refused")
                    except RuntimeError as e:
                        if name not in str(e) or "NCCL" not in str(e):
                            FAILURES.append(f"{op} {dt} on nccl: refused as {e}")
                continue
            want = reference(op, a, b, dt)
            for count in (7, 65536, COUNT):  # small, exhaustive pairs, large
                t = mine[:count].clone()
                comm.all_reduce(t, redop(op), async_op=False)
                check(f"all_reduce {op} {dt} count {count}", t, want[:count], op)
            # reduce_scatter_single: block k of every rank's input reduced
            # into rank k (the inputs halved: block 0 then block 1)
            half = COUNT // 2
            out = torch.empty(half, dtype=dt)
            w = comm.reduce_scatter_single(out, mine[:2 * half].clone(), redop(op),
                                           async_op=True)
            w.wait()
            check(f"reduce_scatter_single {op} {dt}", out,
                  want[r * half:(r + 1) * half], op)
        # data movement: bit-exact
        for root in (0, 1):
            t = mine.clone() if r == root else torch.zeros(COUNT, dtype=dt)
            comm.broadcast(t, root, async_op=False)
            check(f"broadcast root {root} {dt}", t, a if root == 0 else b)
        outs = [torch.empty(COUNT, dtype=dt) for _ in range(n)]
        comm.all_gather(outs, mine, async_op=False)
        check(f"all_gather[0] {dt}", outs[0], a)
        check(f"all_gather[1] {dt}", outs[1], b)
        single = torch.empty(2 * 65536, dtype=dt)
        comm.all_gather_single(single, mine[:65536], async_op=False)
        check(f"all_gather_single {dt}", single, torch.cat([a[:65536], b[:65536]]))
        # a float32 op in between: the dtypes do not leak into each other
        x = torch.full((5,), float(r + 1))
        comm.all_reduce(x, ReduceOp.SUM, async_op=False)
        CHECKS[0] += 1
        if not torch.equal(x, torch.full((5,), 3.0)):
            FAILURES.append(f"float32 all_reduce after {dt}: {x.tolist()}")
    comm.finalize()
    for f in FAILURES:
        print(f"rank {r}: FAIL {f}", flush=True)
    print(f"fp8 worker rank {r} of {n}: {CHECKS[0] - len(FAILURES)} checks passed",
          flush=True)
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
