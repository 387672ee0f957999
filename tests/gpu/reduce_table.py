#!/usr/bin/env python3
"""Every dtype x reduction of all_reduce on the nccl backend, one table.

Run by tests/gpu/run.sh (one rank per GPU, under torchrun). Unlike the C
matrix (tests/c/test_nccl_ops.c), which stops at its first failure, this
tries every pair and prints one line each:

    ok        the result equals torch's own reduction of every rank's input
    refused   RuntimeError from the backend naming what NCCL cannot do
    WRONG     a wrong value, or another error (a crash of NCCL's call)

and exits 1 if any line is WRONG. Rank r's input is [r+1, r+2, ..., r+7]
(bool: alternating), so results are exact in every dtype at small sizes.

    torchrun --nproc_per_node=1 tests/gpu/reduce_table.py [cuda|cpu]
"""

import os
import sys

import torch
from torchcomms import ReduceOp, new_comm

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
          torch.float8_e4m3fn, torch.float8_e5m2, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64, torch.bool]
OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG", "PREMUL_SUM", "BAND", "BOR", "BXOR"]
# what the backend names when it refuses (src/backends/nccl/nccl_ops.c)
REFUSALS = ("NCCL has no", "NCCL cannot", "NCCL's PREMUL_SUM", "not allowed", "not defined")


def inputs(rank, dtype):
    if dtype == torch.bool:
        return torch.tensor([(i + rank) % 2 == 0 for i in range(7)])
    return torch.arange(rank + 1, rank + 8, dtype=torch.float64).to(dtype)


def expected(op, dtype, n):
    xs = [inputs(r, dtype).double() if dtype != torch.bool else inputs(r, dtype) for r in range(n)]
    if dtype == torch.bool:
        table = {"SUM": any, "MAX": any, "BOR": any, "PRODUCT": all, "MIN": all, "BAND": all}
        if op not in table:
            return None
        return torch.tensor([table[op](x[i].item() for x in xs) for i in range(7)])
    s = torch.stack(xs)
    r = {"SUM": s.sum(0), "PRODUCT": s.prod(0), "MIN": s.min(0).values,
         "MAX": s.max(0).values, "AVG": s.mean(0), "PREMUL_SUM": (s * 0.5).sum(0)}.get(op)
    if r is None:
        return None
    if op == "AVG" and not dtype.is_floating_point:
        r = torch.div(s.sum(0), n, rounding_mode="floor")
    return r.to(dtype)


def main():
    kind = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    dev = torch.device(kind, int(os.environ.get("LOCAL_RANK", "0"))) if kind == "cuda" \
        else torch.device("cpu")
    comm = new_comm("nccl", dev, name="reduce_table")
    rank, n = comm.get_rank(), comm.get_size()
    bad = 0
    for dtype in DTYPES:
        for name in OPS:
            op = ReduceOp.PREMUL_SUM(0.5) if name == "PREMUL_SUM" else getattr(ReduceOp, name)
            t = inputs(rank, dtype).to(dev)
            want = expected(name, dtype, n)
            try:
                comm.all_reduce(t, op, async_op=False)
                got = t.cpu()
                if want is not None and torch.equal(got.double() if dtype != torch.bool else got,
                                                    want.double() if dtype != torch.bool else want):
                    line = "ok"
                else:
                    line = f"WRONG: got {got.tolist()}, expected {None if want is None else want.tolist()}"
            except (RuntimeError, ValueError, TypeError) as e:
                msg = str(e).splitlines()[0]
                line = (f"refused: {msg}" if any(r in msg for r in REFUSALS)
                        else f"WRONG: {type(e).__name__}: {msg}")
            bad += line.startswith("WRONG")
            if rank == 0:
                print(f"{str(dtype).replace('torch.', ''):14s} {name:10s} {line[:200]}",
                      flush=True)
    comm.finalize()
    if rank == 0:
        print(f"reduce_table: {len(DTYPES) * len(OPS)} pairs on {n} rank(s), {bad} WRONG",
              flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
