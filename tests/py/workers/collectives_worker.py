#!/usr/bin/env python3
"""Every TorchComm operation on every rank, checked exactly.

Run on every rank by torchrun (or alone: world size 1, in-process store):

    torchrun --standalone --nproc_per_node=4 tests/py/workers/collectives_worker.py OUTDIR

Each rank runs the same list of cases in the same order (they are
collectives), compares every result with a reference computed locally with
torch ops from the inputs of *all* ranks (which every rank can regenerate:
the inputs are a deterministic function of (case, rank)), and writes
OUTDIR/rank<r>.json:

    {"rank": r, "size": n, "cases": {category: count},
     "failures": [{"category", "case", "error"}], "elapsed": seconds}

A failed case does not stop the run. The values are chosen so that every
reduction is exact in every dtype whatever the order of the operations
(small integers, quarters, powers of two), except for the "rounding" cases,
which run at world size 2 only, where a + b is the only possible order.
"""

import gc
import json
import math
import os
import sys
import time
import traceback
import zlib
from datetime import timedelta

import torch

import torchcomms
from torchcomms import ReduceOp, new_comm

F32, F64, F16, BF16 = torch.float32, torch.float64, torch.float16, torch.bfloat16
I8, I16, I32, I64, U8, BOOL = torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool
FLOATS = (F32, F64, F16, BF16)
INTS = (I8, I16, I32, I64, U8)
ALL_DTYPES = (F32, F64, F16, BF16, I32, I64, U8, BOOL)
EXTRA_DTYPES = (I8, I16)
SIZES = (0, 1, 7, 1000)
LARGE = (1 << 17) + 3  # 512 KiB in float32, odd: past the small-message paths
HUGE = (3 << 18) + 5  # 3 MiB in float32: several pipeline segments

TIMEOUT = timedelta(seconds=30)


# --------------------------------------------------------------------------
# Deterministic inputs and local references
# --------------------------------------------------------------------------

def _seed(key):
    return zlib.crc32(repr(key).encode())


_gen_cache = {}


def gen(key, n, dtype, kind="sum"):
    """Rank-independent: every rank can regenerate any rank's input. A fresh
    tensor each call (the generated values are cached)."""
    k = (key, n, dtype, kind)
    t = _gen_cache.get(k)
    if t is None:
        t = _gen(key, n, dtype, kind)
        if len(_gen_cache) > 4096:
            _gen_cache.clear()
        _gen_cache[k] = t
    return t.clone()


def _gen(key, n, dtype, kind):
    g = torch.Generator().manual_seed(_seed(key))
    shape = n if isinstance(n, tuple) else (n,)
    if dtype == BOOL:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype in FLOATS:
        if kind == "product":
            choices = torch.tensor([-2.0, -1.0, -0.5, 0.5, 1.0, 2.0], dtype=F64)
            return choices[torch.randint(0, 6, shape, generator=g)].to(dtype)
        if kind == "random":  # arbitrary bits (min/max, copies)
            return (torch.randn(shape, generator=g, dtype=F64) * 100).to(dtype)
        return (torch.randint(-8, 9, shape, generator=g).to(F64) / 4).to(dtype)
    if kind == "bitwise":
        info = torch.iinfo(dtype)
        return torch.randint(info.min, info.max, shape, generator=g, dtype=torch.int64).to(dtype)
    if kind == "product":
        lo, hi = (0, 4) if dtype == U8 else (-3, 4)
    elif kind == "random":
        info = torch.iinfo(dtype)
        lo, hi = info.min, info.max
    else:
        # no overflow of the sum of 4 ranks, even in int8 / uint8
        lo, hi = {U8: (0, 60), I8: (-30, 31)}.get(dtype, (-100, 101))
    return torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(dtype)


def ref_reduce(xs, op_name, dtype, factor=None):
    """Reduction of the list of tensors xs (one per rank) as the C library
    defines it (see src/reduce/reduce.c)."""
    n = len(xs)
    s = torch.stack(list(xs))
    if s.numel() == 0:
        return torch.empty(xs[0].shape, dtype=dtype)
    if dtype == BOOL:
        if op_name in ("SUM", "MAX", "BOR"):
            return s.any(0)
        if op_name in ("PRODUCT", "MIN", "BAND"):
            return s.all(0)
        if op_name == "BXOR":
            return (s.to(I64).sum(0) % 2).bool()
        raise AssertionError(f"no bool reference for {op_name}")
    if dtype in FLOATS:
        d = s.to(F64)
        r = {
            "SUM": lambda: d.sum(0),
            "PRODUCT": lambda: d.prod(0),
            "MIN": lambda: d.amin(0),
            "MAX": lambda: d.amax(0),
            "AVG": lambda: d.sum(0) / n,
            "PREMUL_SUM": lambda: (d * float(factor)).sum(0),
        }[op_name]()
        return r.to(dtype)
    d = s.to(I64)
    if op_name in ("BAND", "BOR", "BXOR"):
        fn = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[op_name]
        r = d[0]
        for i in range(1, n):
            r = fn(r, d[i])
        return r.to(dtype)
    r = {
        "SUM": lambda: d.sum(0),
        "PRODUCT": lambda: d.prod(0),
        "MIN": lambda: d.amin(0),
        "MAX": lambda: d.amax(0),
        "AVG": lambda: torch.div(d.sum(0), n, rounding_mode="trunc"),
    }[op_name]()
    return r.to(dtype)


def ops_for(dtype):
    """(name, ReduceOp, factor) for every reduction allowed on dtype."""
    base = [("SUM", ReduceOp.SUM, None), ("PRODUCT", ReduceOp.PRODUCT, None),
            ("MIN", ReduceOp.MIN, None), ("MAX", ReduceOp.MAX, None)]
    if dtype in FLOATS:
        return base + [("AVG", ReduceOp.AVG, None),
                       ("PREMUL_SUM", ReduceOp.PREMUL_SUM(0.5), 0.5),
                       ("PREMUL_SUM", ReduceOp.PREMUL_SUM(torch.tensor([2.0])), 2.0),
                       ("PREMUL_SUM", ReduceOp.PREMUL_SUM(torch.tensor(0.25, dtype=F64)), 0.25)]
    bitwise = [("BAND", ReduceOp.BAND, None), ("BOR", ReduceOp.BOR, None),
               ("BXOR", ReduceOp.BXOR, None)]
    if dtype == BOOL:
        return base + bitwise
    return base + bitwise + [("AVG", ReduceOp.AVG, None)]


def kind_for(op_name):
    return {"PRODUCT": "product", "BAND": "bitwise", "BOR": "bitwise", "BXOR": "bitwise",
            "MIN": "random", "MAX": "random"}.get(op_name, "sum")


def dname(dtype):
    return str(dtype).replace("torch.", "")


# --------------------------------------------------------------------------
# The runner
# --------------------------------------------------------------------------

class Runner:
    def __init__(self, comm):
        self.comm = comm
        self.rank = comm.get_rank()
        self.size = comm.get_size()
        self.cases = {}
        self.times = {}
        self.failures = []
        self.category = None
        self.case_index = 0

    def check(self, case, got, expected):
        """Record one case: got must equal expected exactly (dtype and shape
        included)."""
        self.cases[self.category] = self.cases.get(self.category, 0) + 1
        self.case_index += 1
        if isinstance(got, torch.Tensor):
            ok = (got.dtype == expected.dtype and got.shape == expected.shape
                  and torch.equal(got, expected))
        else:
            ok = got == expected
        if not ok:
            self.fail(case, _diff(got, expected))

    def fail(self, case, error):
        self.failures.append({"category": self.category, "case": case, "error": error[:2000]})

    def run_category(self, name, fn):
        self.category = name
        self.cases.setdefault(name, 0)
        t0 = time.monotonic()
        try:
            fn(self)
        except Exception:
            self.fail("<category aborted>", traceback.format_exc())
        self.times[name] = round(time.monotonic() - t0, 3)

    def use_async(self):
        """Alternate sync and async issue from case to case."""
        return self.case_index % 2 == 1

    def finish(self, work, async_op):
        if async_op:
            assert isinstance(work, torchcomms.TorchWork), type(work)
            work.wait()
        return work


def _diff(got, expected):
    if not isinstance(got, torch.Tensor) or not isinstance(expected, torch.Tensor):
        return f"got {got!r}, expected {expected!r}"
    if got.dtype != expected.dtype or got.shape != expected.shape:
        return (f"got dtype {got.dtype} shape {tuple(got.shape)}, expected dtype "
                f"{expected.dtype} shape {tuple(expected.shape)}")
    bad = (got != expected).reshape(-1).nonzero().reshape(-1)
    i = int(bad[0]) if bad.numel() else 0
    g, e = got.reshape(-1), expected.reshape(-1)
    return (f"{bad.numel()} of {got.numel()} elements differ; first at flat index {i}: "
            f"got {g[i].item()!r}, expected {e[i].item()!r}")


# --------------------------------------------------------------------------
# Cases, one function per category. Every rank runs the same calls.
# --------------------------------------------------------------------------

def c_info(R):
    comm = R.comm
    R.check("get_size", comm.get_size(), int(os.environ.get("WORLD_SIZE", "1")))
    R.check("get_rank", comm.get_rank(), int(os.environ.get("RANK", "0")))
    R.check("get_name", comm.get_name(), "collectives")
    R.check("get_backend", comm.get_backend(), "cpu")
    R.check("get_device", comm.get_device(), torch.device("cpu"))
    R.check("get_backend_version is str", isinstance(comm.get_backend_version(), str), True)
    opts = comm.get_options()
    R.check("options.timeout", opts.timeout, TIMEOUT)
    R.check("rank property", comm.rank, R.rank)
    R.check("size property", comm.size, R.size)
    R.check("name property", comm.name, "collectives")
    R.check("is_aborted", comm.is_aborted(), False)


def c_all_reduce(R):
    for dtype in ALL_DTYPES + EXTRA_DTYPES:
        for op_name, op, factor in ops_for(dtype):
            sizes = SIZES if dtype in ALL_DTYPES else (7,)
            for n in sizes:
                key = ("ar", dname(dtype), op_name, factor, n)
                kind = kind_for(op_name)
                t = gen(key + (R.rank,), n, dtype, kind)
                a = R.use_async()
                R.finish(R.comm.all_reduce(t, op, async_op=a), a)
                exp = ref_reduce([gen(key + (r,), n, dtype, kind) for r in range(R.size)],
                                 op_name, dtype, factor)
                R.check(f"all_reduce {dname(dtype)} {op_name}({factor}) n={n} async={a}", t, exp)
    # large messages (other algorithms), 2-D shapes
    for dtype, op_name, op in ((F32, "SUM", ReduceOp.SUM), (BF16, "SUM", ReduceOp.SUM),
                               (F16, "AVG", ReduceOp.AVG), (I64, "MAX", ReduceOp.MAX),
                               (F64, "MIN", ReduceOp.MIN), (I32, "BXOR", ReduceOp.BXOR),
                               (U8, "SUM", ReduceOp.SUM), (BOOL, "BOR", ReduceOp.BOR)):
        for a in (False, True):
            key = ("arL", dname(dtype), op_name, a)
            kind = kind_for(op_name)
            t = gen(key + (R.rank,), LARGE, dtype, kind)
            R.finish(R.comm.all_reduce(t, op, async_op=a), a)
            exp = ref_reduce([gen(key + (r,), LARGE, dtype, kind) for r in range(R.size)],
                             op_name, dtype)
            R.check(f"all_reduce large {dname(dtype)} {op_name} async={a}", t, exp)
    for dtype, op_name, op in ((F32, "SUM", ReduceOp.SUM), (BF16, "MAX", ReduceOp.MAX),
                               (I64, "BXOR", ReduceOp.BXOR)):
        key = ("arH", dname(dtype), op_name)
        kind = kind_for(op_name)
        t = gen(key + (R.rank,), HUGE, dtype, kind)
        R.finish(R.comm.all_reduce(t, op, async_op=True), True)
        exp = ref_reduce([gen(key + (r,), HUGE, dtype, kind) for r in range(R.size)],
                         op_name, dtype)
        R.check(f"all_reduce huge {dname(dtype)} {op_name}", t, exp)
    key = ("ar2d",)
    t = gen(key + (R.rank,), (33, 17), F32)
    R.comm.all_reduce(t, ReduceOp.SUM, async_op=False)
    R.check("all_reduce 2-D (33, 17)", t,
            ref_reduce([gen(key + (r,), (33, 17), F32) for r in range(R.size)], "SUM", F32))
    # PREMUL_SUM with a factor that is not a power of two (rounded once)
    key = ("arpm3",)
    t = gen(key + (R.rank,), 64, F64)
    R.comm.all_reduce(t, ReduceOp.PREMUL_SUM(3.0), async_op=False)
    R.check("all_reduce float64 PREMUL_SUM(3.0)", t,
            ref_reduce([gen(key + (r,), 64, F64) for r in range(R.size)], "PREMUL_SUM", F64, 3.0))


def c_rounding(R):
    """At world size 2 the sum is a + b in any order: arbitrary floats, and
    float16/bfloat16 rounded to nearest even (computed in float32)."""
    if R.size != 2:
        return
    for dtype in FLOATS:
        for n in (1, 1000, LARGE):
            key = ("round", dname(dtype), n)
            # magnitudes in [0.5, 2): the float32 sum of two 16-bit floats is exact
            def mk(r):
                g = torch.Generator().manual_seed(_seed(key + (r,)))
                mag = torch.rand(n, generator=g, dtype=F64) * 1.5 + 0.5
                sign = torch.randint(0, 2, (n,), generator=g) * 2 - 1
                return (mag * sign).to(dtype)
            t = mk(R.rank)
            R.comm.all_reduce(t, ReduceOp.SUM, async_op=False)
            a, b = mk(0), mk(1)
            if dtype in (F16, BF16):
                exp = (a.float() + b.float()).to(dtype)
            else:
                exp = a + b
            R.check(f"all_reduce SUM rounding {dname(dtype)} n={n}", t, exp)
            # and AVG: (a + b) / 2
            t = mk(R.rank)
            R.comm.all_reduce(t, ReduceOp.AVG, async_op=True).wait()
            if dtype in (F16, BF16):
                exp = ((a.float() + b.float()).to(dtype).float() / 2).to(dtype)
            else:
                exp = (a + b) / 2
            R.check(f"all_reduce AVG rounding {dname(dtype)} n={n}", t, exp)


def c_reduce(R):
    i = 0
    for dtype in ALL_DTYPES:
        for op_name, op, factor in ops_for(dtype):
            for n in (0, 7, 1000):
                root = i % R.size
                i += 1
                key = ("red", dname(dtype), op_name, factor, n)
                kind = kind_for(op_name)
                t = gen(key + (R.rank,), n, dtype, kind)
                before = t.clone()
                a = R.use_async()
                R.finish(R.comm.reduce(t, root, op, async_op=a), a)
                if R.rank == root:
                    exp = ref_reduce([gen(key + (r,), n, dtype, kind) for r in range(R.size)],
                                     op_name, dtype, factor)
                    R.check(f"reduce {dname(dtype)} {op_name} n={n} root={root} async={a}", t, exp)
                else:
                    R.check(f"reduce non-root unchanged {dname(dtype)} {op_name} n={n}", t, before)
    for root in range(R.size):
        key = ("redL", root)
        t = gen(key + (R.rank,), LARGE, F32)
        R.comm.reduce(t, root, ReduceOp.SUM, async_op=False)
        if R.rank == root:
            R.check(f"reduce large root={root}", t,
                    ref_reduce([gen(key + (r,), LARGE, F32) for r in range(R.size)], "SUM", F32))


def c_broadcast(R):
    for dtype in ALL_DTYPES + EXTRA_DTYPES:
        for n in SIZES + (LARGE,):
            for root in range(R.size):
                key = ("bc", dname(dtype), n, root)
                t = gen(key, n, dtype, "random") if R.rank == root else torch.zeros(n, dtype=dtype)
                a = R.use_async()
                R.finish(R.comm.broadcast(t, root, async_op=a), a)
                R.check(f"broadcast {dname(dtype)} n={n} root={root} async={a}", t,
                        gen(key, n, dtype, "random"))
    for root in range(R.size):
        key = ("bcH", root)
        t = gen(key, HUGE, F32, "random") if R.rank == root else torch.zeros(HUGE)
        R.comm.broadcast(t, root, async_op=False)
        R.check(f"broadcast huge root={root}", t, gen(key, HUGE, F32, "random"))
    # requires_grad parameters (what DDP broadcasts)
    p = torch.nn.Parameter(gen(("bcp",), (4, 5), F32) if R.rank == 0 else torch.zeros(4, 5))
    with torch.no_grad():
        R.comm.broadcast(p, 0, async_op=False)
    R.check("broadcast nn.Parameter", p.detach(), gen(("bcp",), (4, 5), F32))


def c_send_recv(R):
    if R.size == 1:
        return
    for k in range(1, R.size):
        dst, src = (R.rank + k) % R.size, (R.rank - k) % R.size
        # r -> r + k splits the ranks into cycles; the first rank of each
        # cycle sends first, every other one receives first: a chain that
        # cannot deadlock whatever the cycle's length (blocking sends)
        first = R.rank < math.gcd(R.size, k)  # ranks 0..g-1: one per cycle
        for dtype in ALL_DTYPES:
            for n in SIZES + (LARGE,):
                key = ("sr", k, dname(dtype), n)
                out = gen(key + (R.rank,), n, dtype, "random")
                got = torch.zeros(n, dtype=dtype)
                a = R.use_async()
                if first:
                    w1 = R.comm.send(out, dst, async_op=a)
                    w2 = R.comm.recv(got, src, async_op=a)
                else:
                    w2 = R.comm.recv(got, src, async_op=a)
                    w1 = R.comm.send(out, dst, async_op=a)
                if a:
                    w1.wait()
                    w2.wait()
                R.check(f"send/recv +{k} {dname(dtype)} n={n} async={a}", got,
                        gen(key + (src,), n, dtype, "random"))
    # several messages to the same peer arrive in order
    if R.size >= 2:
        peer = R.rank ^ 1
        if peer < R.size:
            outs = [gen(("srord", R.rank, i), 10 + i, I32, "random") for i in range(5)]
            ins = [torch.zeros(10 + i, dtype=I32) for i in range(5)]
            if R.rank % 2 == 0:
                works = [R.comm.send(t, peer, async_op=True) for t in outs]
                works += [R.comm.recv(t, peer, async_op=True) for t in ins]
            else:
                works = [R.comm.recv(t, peer, async_op=True) for t in ins]
                works += [R.comm.send(t, peer, async_op=True) for t in outs]
            for w in reversed(works):
                w.wait()
            for i in range(5):
                R.check(f"send/recv in order #{i}", ins[i], gen(("srord", peer, i), 10 + i, I32, "random"))


def c_all_gather(R):
    for dtype in ALL_DTYPES:
        for n in SIZES + (LARGE,):
            key = ("ag", dname(dtype), n)
            mine = gen(key + (R.rank,), n, dtype, "random")
            outs = [torch.zeros(n, dtype=dtype) for _ in range(R.size)]
            a = R.use_async()
            R.finish(R.comm.all_gather(outs, mine, async_op=a), a)
            for r in range(R.size):
                R.check(f"all_gather {dname(dtype)} n={n} [{r}] async={a}", outs[r],
                        gen(key + (r,), n, dtype, "random"))
    # 2-D tensors; views into one buffer
    key = ("ag2d",)
    mine = gen(key + (R.rank,), (3, 5), I64, "random")
    buf = torch.zeros(R.size * 3, 5, dtype=I64)
    R.comm.all_gather(list(buf.chunk(R.size)), mine, async_op=False)
    R.check("all_gather 2-D into views", buf,
            torch.cat([gen(key + (r,), (3, 5), I64, "random") for r in range(R.size)]))


def c_all_gather_v(R):
    for dtype in (F32, BF16, I64, U8, BOOL):
        for base in (0, 3, 1000):
            sizes = [base + 2 * r for r in range(R.size)]  # rank 0 sends `base` (0 too)
            key = ("agv", dname(dtype), base)
            mine = gen(key + (R.rank,), sizes[R.rank], dtype, "random")
            outs = [torch.zeros(s, dtype=dtype) for s in sizes]
            a = R.use_async()
            R.finish(R.comm.all_gather_v(outs, mine, async_op=a), a)
            for r in range(R.size):
                R.check(f"all_gather_v {dname(dtype)} sizes={sizes} [{r}] async={a}", outs[r],
                        gen(key + (r,), sizes[r], dtype, "random"))


def c_all_gather_single(R):
    for dtype in ALL_DTYPES:
        for n in SIZES + (LARGE,):
            key = ("ags", dname(dtype), n)
            mine = gen(key + (R.rank,), n, dtype, "random")
            out = torch.zeros(R.size * n, dtype=dtype)
            a = R.use_async()
            R.finish(R.comm.all_gather_single(out, mine, async_op=a), a)
            R.check(f"all_gather_single {dname(dtype)} n={n} async={a}", out,
                    torch.cat([gen(key + (r,), n, dtype, "random") for r in range(R.size)]))
    # in place: input is this rank's block of the output
    key = ("agsip",)
    out = torch.zeros(R.size * 9, dtype=F64)
    out[R.rank * 9:(R.rank + 1) * 9] = gen(key + (R.rank,), 9, F64, "random")
    R.comm.all_gather_single(out, out[R.rank * 9:(R.rank + 1) * 9], async_op=False)
    R.check("all_gather_single in place", out,
            torch.cat([gen(key + (r,), 9, F64, "random") for r in range(R.size)]))


def c_reduce_scatter(R):
    for dtype in ALL_DTYPES:
        for op_name, op, factor in ops_for(dtype):
            for n in (0, 7, 1000):
                key = ("rs", dname(dtype), op_name, factor, n)
                kind = kind_for(op_name)
                ins = [gen(key + (R.rank, i), n, dtype, kind) for i in range(R.size)]
                out = torch.zeros(n, dtype=dtype)
                a = R.use_async()
                R.finish(R.comm.reduce_scatter(out, ins, op, async_op=a), a)
                exp = ref_reduce([gen(key + (r, R.rank), n, dtype, kind) for r in range(R.size)],
                                 op_name, dtype, factor)
                R.check(f"reduce_scatter {dname(dtype)} {op_name}({factor}) n={n} async={a}", out, exp)
    key = ("rsL",)
    ins = [gen(key + (R.rank, i), LARGE, F32) for i in range(R.size)]
    out = torch.zeros(LARGE, dtype=F32)
    R.comm.reduce_scatter(out, ins, ReduceOp.SUM, async_op=False)
    R.check("reduce_scatter large", out,
            ref_reduce([gen(key + (r, R.rank), LARGE, F32) for r in range(R.size)], "SUM", F32))


def c_reduce_scatter_v(R):
    for dtype in (F32, F16, I32, U8, BOOL):
        for op_name, op, factor in ops_for(dtype)[:4] + ([("AVG", ReduceOp.AVG, None)] if dtype != BOOL else []):
            for base in (0, 5, 999):
                sizes = [base + 3 * i for i in range(R.size)]
                key = ("rsv", dname(dtype), op_name, base)
                kind = kind_for(op_name)
                ins = [gen(key + (R.rank, i), sizes[i], dtype, kind) for i in range(R.size)]
                out = torch.zeros(sizes[R.rank], dtype=dtype)
                a = R.use_async()
                R.finish(R.comm.reduce_scatter_v(out, ins, op, async_op=a), a)
                exp = ref_reduce([gen(key + (r, R.rank), sizes[R.rank], dtype, kind)
                                  for r in range(R.size)], op_name, dtype, factor)
                R.check(f"reduce_scatter_v {dname(dtype)} {op_name} sizes={sizes} async={a}", out, exp)


def c_reduce_scatter_single(R):
    for dtype in ALL_DTYPES:
        for op_name, op, factor in ops_for(dtype):
            for n in (0, 1, 1000):
                key = ("rss", dname(dtype), op_name, factor, n)
                kind = kind_for(op_name)
                inp = gen(key + (R.rank,), R.size * n, dtype, kind)
                out = torch.zeros(n, dtype=dtype)
                a = R.use_async()
                R.finish(R.comm.reduce_scatter_single(out, inp, op, async_op=a), a)
                blocks = [gen(key + (r,), R.size * n, dtype, kind)[R.rank * n:(R.rank + 1) * n]
                          for r in range(R.size)]
                R.check(f"reduce_scatter_single {dname(dtype)} {op_name}({factor}) n={n} async={a}",
                        out, ref_reduce(blocks, op_name, dtype, factor))
    key = ("rssL",)
    inp = gen(key + (R.rank,), R.size * LARGE, BF16)
    out = torch.zeros(LARGE, dtype=BF16)
    R.comm.reduce_scatter_single(out, inp, ReduceOp.SUM, async_op=True).wait()
    blocks = [gen(key + (r,), R.size * LARGE, BF16)[R.rank * LARGE:(R.rank + 1) * LARGE]
              for r in range(R.size)]
    R.check("reduce_scatter_single large bf16", out, ref_reduce(blocks, "SUM", BF16))
    key = ("rssH",)
    inp = gen(key + (R.rank,), R.size * HUGE, F32)
    out = torch.zeros(HUGE, dtype=F32)
    R.comm.reduce_scatter_single(out, inp, ReduceOp.SUM, async_op=False)
    blocks = [gen(key + (r,), R.size * HUGE, F32)[R.rank * HUGE:(R.rank + 1) * HUGE]
              for r in range(R.size)]
    R.check("reduce_scatter_single huge f32", out, ref_reduce(blocks, "SUM", F32))


def c_all_to_all_single(R):
    for dtype in ALL_DTYPES:
        for n in SIZES + (LARGE // 4,) + ((HUGE // 2,) if dtype == F32 else ()):
            key = ("a2a", dname(dtype), n)
            inp = gen(key + (R.rank,), R.size * n, dtype, "random")
            out = torch.zeros(R.size * n, dtype=dtype)
            a = R.use_async()
            R.finish(R.comm.all_to_all_single(out, inp, async_op=a), a)
            exp = torch.cat([gen(key + (r,), R.size * n, dtype, "random")[R.rank * n:(R.rank + 1) * n]
                             for r in range(R.size)])
            R.check(f"all_to_all_single {dname(dtype)} n={n} async={a}", out, exp)


def c_all_to_all_v_single(R):
    def rows(src, dst, salt):
        return (src * 3 + dst * 5 + salt) % 4  # uneven, some 0

    for dtype in (F32, F64, BF16, I64, U8, BOOL):
        for cols in (1, 7):
            for salt in (0, 1, 2):
                key = ("a2av", dname(dtype), cols, salt)
                in_splits = [rows(R.rank, d, salt) for d in range(R.size)]
                out_splits = [rows(s, R.rank, salt) for s in range(R.size)]
                inp = torch.cat([gen(key + (R.rank, d), (in_splits[d], cols), dtype, "random")
                                 for d in range(R.size)])
                out = torch.zeros(sum(out_splits), cols, dtype=dtype)
                if cols == 1:  # 1-D as well
                    inp, out = inp.reshape(-1), out.reshape(-1)
                a = R.use_async()
                R.finish(R.comm.all_to_all_v_single(out, inp, out_splits, in_splits, async_op=a), a)
                exp = torch.cat([gen(key + (s, R.rank), (out_splits[s], cols), dtype, "random")
                                 for s in range(R.size)])
                if cols == 1:
                    exp = exp.reshape(-1)
                R.check(f"all_to_all_v_single {dname(dtype)} cols={cols} in={in_splits} "
                        f"out={out_splits} async={a}", out, exp)
    # [] split sizes: equal splits
    for a in (False, True):
        key = ("a2av_eq", a)
        inp = gen(key + (R.rank,), (R.size * 3, 2), I32, "random")
        out = torch.zeros(R.size * 3, 2, dtype=I32)
        R.finish(R.comm.all_to_all_v_single(out, inp, [], [], async_op=a), a)
        R.check(f"all_to_all_v_single [] splits async={a}", out,
                torch.cat([gen(key + (r,), (R.size * 3, 2), I32, "random")[3 * R.rank:3 * R.rank + 3]
                           for r in range(R.size)]))
    # large and uneven
    key = ("a2avL",)
    in_splits = [1000 * (d + 1) + R.rank for d in range(R.size)]
    out_splits = [1000 * (R.rank + 1) + s for s in range(R.size)]
    inp = torch.cat([gen(key + (R.rank, d), in_splits[d], F32, "random") for d in range(R.size)])
    out = torch.zeros(sum(out_splits), dtype=F32)
    R.comm.all_to_all_v_single(out, inp, out_splits, in_splits, async_op=False)
    R.check("all_to_all_v_single large uneven", out,
            torch.cat([gen(key + (s, R.rank), out_splits[s], F32, "random") for s in range(R.size)]))


def c_all_to_all(R):
    def n_of(src, dst, base):
        return base + (src + 2 * dst) % 3

    for dtype in ALL_DTYPES:
        for base in (0, 4, 1000):
            key = ("a2al", dname(dtype), base)
            ins = [gen(key + (R.rank, d), n_of(R.rank, d, base), dtype, "random") for d in range(R.size)]
            outs = [torch.zeros(n_of(s, R.rank, base), dtype=dtype) for s in range(R.size)]
            a = R.use_async()
            R.finish(R.comm.all_to_all(outs, ins, async_op=a), a)
            for s in range(R.size):
                R.check(f"all_to_all {dname(dtype)} base={base} [{s}] async={a}", outs[s],
                        gen(key + (s, R.rank), n_of(s, R.rank, base), dtype, "random"))


def c_barrier(R):
    R.comm.barrier(async_op=False)
    R.check("barrier sync", True, True)
    w = R.comm.barrier(async_op=True)
    w.wait()
    R.check("barrier async completed", w.is_completed(), True)
    R.comm.barrier(False)
    R.check("barrier positional async_op", True, True)


def c_scatter(R):
    for dtype in ALL_DTYPES:
        for n in SIZES + (LARGE,):
            for root in range(R.size):
                key = ("sc", dname(dtype), n, root)
                ins = [gen(key + (i,), n, dtype, "random") for i in range(R.size)] if R.rank == root else []
                out = torch.zeros(n, dtype=dtype)
                a = R.use_async()
                R.finish(R.comm.scatter(out, ins, root, async_op=a), a)
                R.check(f"scatter {dname(dtype)} n={n} root={root} async={a}", out,
                        gen(key + (R.rank,), n, dtype, "random"))


def c_gather(R):
    for dtype in ALL_DTYPES:
        for n in SIZES + (LARGE,):
            for root in range(R.size):
                key = ("ga", dname(dtype), n, root)
                mine = gen(key + (R.rank,), n, dtype, "random")
                # the root passes the list; the others pass [] (objcol passes
                # a full list everywhere: both forms are exercised)
                if R.rank == root or (root + n) % 2:
                    outs = [torch.zeros(n, dtype=dtype) for _ in range(R.size)]
                else:
                    outs = []
                a = R.use_async()
                R.finish(R.comm.gather(outs, mine, root, async_op=a), a)
                if R.rank == root:
                    for r in range(R.size):
                        R.check(f"gather {dname(dtype)} n={n} root={root} [{r}] async={a}", outs[r],
                                gen(key + (r,), n, dtype, "random"))


def c_gather_single(R):
    for dtype in ALL_DTYPES:
        for n in SIZES + (LARGE,):
            for root in range(R.size):
                key = ("gas", dname(dtype), n, root)
                mine = gen(key + (R.rank,), n, dtype, "random")
                out = torch.zeros(R.size * n, dtype=dtype)
                a = R.use_async()
                R.finish(R.comm.gather_single(out, mine, root, async_op=a), a)
                if R.rank == root:
                    R.check(f"gather_single {dname(dtype)} n={n} root={root} async={a}", out,
                            torch.cat([gen(key + (r,), n, dtype, "random") for r in range(R.size)]))


def c_batch(R):
    for a in (False, True):
        for dtype in (F32, BF16, I64, BOOL):
            for n in (0, 5, LARGE):
                key = ("batch", a, dname(dtype), n)
                sends = [gen(key + (R.rank, p), n, dtype, "random") for p in range(R.size)]
                recvs = [torch.zeros(n, dtype=dtype) for _ in range(R.size)]
                b = R.comm.batch_op_create()
                # receives first: order inside a batch does not matter
                for p in range(R.size):
                    b.recv(recvs[p], p)
                for p in range(R.size):
                    b.send(sends[p], p)
                R.check("batch ops count", len(b.ops), 2 * R.size)
                w = b.issue(a)
                if a:
                    w.wait()
                for p in range(R.size):
                    R.check(f"batch async={a} {dname(dtype)} n={n} from {p}", recvs[p],
                            gen(key + (p, R.rank), n, dtype, "random"))
    # two messages to the same peer match in posted order; P2POp in ops
    if R.size >= 2:
        peer = (R.rank + 1) % R.size
        src = (R.rank - 1) % R.size
        key = ("batchord",)
        b = R.comm.batch_op_create()
        x = [gen(key + (R.rank, i), 4, I32, "random") for i in range(2)]
        y = [torch.zeros(4, dtype=I32) for _ in range(2)]
        b.send(x[0], peer)
        b.send(x[1], peer)
        b.recv(y[0], src)
        b.recv(y[1], src)
        R.check("batch P2POp types", [op.type for op in b.ops],
                [torchcomms.P2POpType.SEND] * 2 + [torchcomms.P2POpType.RECV] * 2)
        R.check("batch P2POp peers", [op.peer for op in b.ops], [peer, peer, src, src])
        b.issue(async_op=False, options=torchcomms.BatchP2POptions())
        for i in range(2):
            R.check(f"batch same-peer order #{i}", y[i], gen(key + (src, i), 4, I32, "random"))


def c_split(R):
    comm = R.comm
    # everyone together, reversed order: new rank = position in the list
    ranks = list(reversed(range(R.size)))
    sub = comm.split(ranks, "rev")
    R.check("split reversed rank", sub.get_rank(), ranks.index(R.rank))
    R.check("split reversed size", sub.get_size(), R.size)
    R.check("split name", sub.get_name(), "rev")
    t = torch.full((5,), float(sub.get_rank() + 1))
    sub.all_reduce(t, ReduceOp.SUM, async_op=False)
    R.check("split reversed all_reduce", t, torch.full((5,), float(R.size * (R.size + 1) // 2)))
    t = torch.zeros(3, dtype=I64) if sub.get_rank() else torch.arange(3)
    sub.broadcast(t, 0, async_op=False)  # root 0 of sub = last rank of comm
    R.check("split reversed broadcast", t, torch.arange(3))
    sub.finalize()

    # halves: [0 .. h) and [h .. n); with world size 1 a single group
    h = (R.size + 1) // 2
    group = list(range(h)) if R.rank < h else list(range(h, R.size))
    sub = comm.split(group, "halves", timeout=TIMEOUT)
    R.check("split halves size", sub.get_size(), len(group))
    R.check("split halves rank", sub.get_rank(), group.index(R.rank))
    t = torch.tensor([R.rank], dtype=I64)
    sub.all_reduce(t, ReduceOp.SUM, async_op=True).wait()
    R.check("split halves all_reduce", t, torch.tensor([sum(group)], dtype=I64))
    # a split of the split (ranks are the parent's, here the half's: 0)
    sub2 = sub.split([0] if R.rank == group[0] else [], "first_of_half")
    if R.rank == group[0]:
        R.check("split of split size", sub2.get_size(), 1)
        x = torch.tensor([7.0])
        sub2.all_reduce(x, ReduceOp.MAX, async_op=False)
        R.check("split of split all_reduce", x, torch.tensor([7.0]))
        sub2.finalize()
    else:
        R.check("split of split None", sub2, None)
    sub.finalize()

    # only rank 0 joins; the others pass [] and get None
    sub = comm.split([0] if R.rank == 0 else [], "only0")
    if R.rank == 0:
        R.check("split only0 size", sub.get_size(), 1)
        sub.finalize()
    else:
        R.check("split [] -> None", sub, None)
    # the parent still works
    t = torch.ones(4)
    comm.all_reduce(t, ReduceOp.SUM, async_op=False)
    R.check("parent after splits", t, torch.full((4,), float(R.size)))


def c_async_many(R):
    """Many operations in flight at once, waited on in reverse order, mixed
    kinds; then works dropped without wait (the communicator keeps them)."""
    ts, works, exps = [], [], []
    for i in range(24):
        key = ("many", i)
        if i % 3 == 0:
            t = gen(key + (R.rank,), 100 + i, F32)
            works.append(R.comm.all_reduce(t, ReduceOp.SUM, async_op=True))
            exps.append(ref_reduce([gen(key + (r,), 100 + i, F32) for r in range(R.size)], "SUM", F32))
        elif i % 3 == 1:
            root = i % R.size
            t = gen(key, 50, I32, "random") if R.rank == root else torch.zeros(50, dtype=I32)
            works.append(R.comm.broadcast(t, root, async_op=True))
            exps.append(gen(key, 50, I32, "random"))
        else:
            out = torch.zeros(R.size * 3, dtype=I64)
            works.append(R.comm.all_gather_single(out, gen(key + (R.rank,), 3, I64, "random"), async_op=True))
            t = out
            exps.append(torch.cat([gen(key + (r,), 3, I64, "random") for r in range(R.size)]))
        ts.append(t)
    for w in reversed(works):
        w.wait()
    for i, (t, e) in enumerate(zip(ts, exps)):
        R.check(f"in flight #{i}", t, e)
    R.check("all completed", all(w.is_completed() for w in works), True)
    R.check("status COMPLETED", {str(w.status()) for w in works},
            {str(torchcomms.WorkStatus.COMPLETED)})

    # dropped works and dropped input tensors: the library keeps what it needs
    kept = []
    for i in range(8):
        t = torch.full((1000,), float(i))
        R.comm.all_reduce(t, ReduceOp.SUM, async_op=True)  # TorchWork dropped at once
        kept.append(t)
    w = R.comm.all_reduce(torch.ones(1 << 16), ReduceOp.SUM, async_op=True)  # tensor dropped
    gc.collect()
    w.wait()
    R.comm.barrier(async_op=False)  # issue order: everything before is done
    for i, t in enumerate(kept):
        R.check(f"dropped work #{i}", t, torch.full((1000,), float(i * R.size)))
    # sync work objects are already complete; wait() is harmless
    w = R.comm.all_reduce(torch.ones(2), ReduceOp.SUM, async_op=False)
    R.check("sync work is_completed", w.is_completed(), True)
    w.wait()
    try:  # torchcomms' fault-tolerance wait: not implemented without FT
        w.wait_blocking()
        R.check("wait_blocking raises RuntimeError", "returned", "raised")
    except RuntimeError as e:
        R.check("wait_blocking message", "waitBlocking not implemented" in str(e), True)


def c_options(R):
    """hints / timeout keywords, timedelta timeouts, set_timeout."""
    t = torch.ones(8)
    R.comm.all_reduce(t, ReduceOp.SUM, async_op=False, hints={"k": "v"}, timeout=timedelta(seconds=30))
    R.check("all_reduce with hints+timeout", t, torch.full((8,), float(R.size)))
    t = torch.ones(8)
    R.comm.all_reduce(t, ReduceOp.SUM, False, None, None)  # positional as in the pyi
    R.check("all_reduce positional hints/timeout", t, torch.full((8,), float(R.size)))
    R.comm.set_timeout(timedelta(seconds=45))
    R.check("set_timeout", R.comm.get_options().timeout, timedelta(seconds=45))
    R.comm.set_timeout(TIMEOUT)
    t = torch.ones(3, dtype=I32) * (R.rank + 1)
    R.comm.all_reduce(t, op=ReduceOp.MAX, async_op=True).wait()
    R.check("keyword op", t, torch.full((3,), R.size, dtype=I32))


def c_errors_recover(R):
    """A rejected call (validated locally, before any communication) leaves
    the communicator in step: the next collective still works."""
    bad = [
        ("all_gather list too long", ValueError,
         lambda: R.comm.all_gather([torch.zeros(2)] * (R.size + 1), torch.zeros(2), async_op=False)),
        ("all_gather list sizes", ValueError,
         lambda: R.comm.all_gather([torch.zeros(3)] * R.size, torch.zeros(2), async_op=False)),
        ("all_reduce BAND float", TypeError,
         lambda: R.comm.all_reduce(torch.zeros(2), ReduceOp.BAND, async_op=False)),
        ("broadcast root out of range", ValueError,
         lambda: R.comm.broadcast(torch.zeros(2), R.size, async_op=False)),
        ("all_to_all_v_single splits sum", ValueError,
         lambda: R.comm.all_to_all_v_single(torch.zeros(R.size), torch.zeros(R.size),
                                            [1] * R.size, [2] * R.size, async_op=False)),
        ("non-contiguous", ValueError,
         lambda: R.comm.all_reduce(torch.zeros(3, 4).t(), ReduceOp.SUM, async_op=False)),
    ]
    for name, exc, fn in bad:
        try:
            fn()
        except exc:
            R.check(f"{name} raises {exc.__name__}", True, True)
        except Exception as e:  # noqa: BLE001
            R.fail(name, f"raised {type(e).__name__}: {e} (expected {exc.__name__})")
        else:
            R.fail(name, f"did not raise (expected {exc.__name__})")
        t = torch.ones(4)
        R.comm.all_reduce(t, ReduceOp.SUM, async_op=False)
        R.check(f"all_reduce after '{name}'", t, torch.full((4,), float(R.size)))


def c_aliases(R):
    """The seeds' spellings (allreduce, allgather, ...) do the same thing."""
    comm, n = R.comm, R.size
    ar = torch.arange(n, dtype=F32)
    t = torch.ones(2)
    comm.allreduce(t, ReduceOp.SUM, async_op=False)
    R.check("allreduce", t, torch.full((2,), float(n)))
    outs = [torch.zeros(1) for _ in range(n)]
    comm.allgather(outs, torch.tensor([float(R.rank)]), async_op=False)
    R.check("allgather", torch.cat(outs), ar)
    outs = [torch.zeros(1) for _ in range(n)]
    comm.allgather_v(outs, torch.tensor([float(R.rank)]), async_op=False)
    R.check("allgather_v", torch.cat(outs), ar)
    out = torch.zeros(n)
    comm.allgather_single(out, torch.tensor([float(R.rank)]), async_op=False)
    R.check("allgather_single", out, ar)
    out = torch.zeros(1)
    comm.reducescatter(out, [torch.full((1,), float(i)) for i in range(n)], ReduceOp.SUM,
                       async_op=False)
    R.check("reducescatter", out, torch.tensor([float(R.rank * n)]))
    out = torch.zeros(1)
    comm.reducescatter_v(out, [torch.full((1,), float(i)) for i in range(n)], ReduceOp.SUM,
                         async_op=False)
    R.check("reducescatter_v", out, torch.tensor([float(R.rank * n)]))
    out = torch.zeros(1)
    comm.reducescatter_single(out, ar.clone(), ReduceOp.SUM, async_op=False)
    R.check("reducescatter_single", out, torch.tensor([float(R.rank * n)]))
    out = torch.zeros(n)
    comm.alltoall_single(out, torch.full((n,), float(R.rank)), async_op=False)
    R.check("alltoall_single", out, ar)
    out = torch.zeros(n)
    comm.alltoallv_single(out, torch.full((n,), float(R.rank)), [1] * n, [1] * n, async_op=False)
    R.check("alltoallv_single", out, ar)
    outs = [torch.zeros(1) for _ in range(n)]
    comm.alltoall(outs, [torch.full((1,), float(R.rank)) for _ in range(n)], async_op=False)
    R.check("alltoall", torch.cat(outs), ar)


def c_views(R):
    """Views with a storage offset (data_ptr() includes it): only the view's
    elements change; 0-d tensors; in-place forms; requires_grad leaves."""
    n = R.size
    base = torch.arange(100, dtype=F32)
    v = base[10:30]
    R.comm.all_reduce(v, ReduceOp.SUM, async_op=False)
    exp = torch.arange(100, dtype=F32)
    exp[10:30] *= n
    R.check("all_reduce on a view: only the view changes", base, exp)

    base = torch.zeros(4, 6, dtype=I64)
    row = base[2]
    if R.rank == 0:
        row.copy_(torch.arange(6))
    R.comm.broadcast(row, 0, async_op=True).wait()
    exp = torch.zeros(4, 6, dtype=I64)
    exp[2] = torch.arange(6)
    R.check("broadcast into a row view", base, exp)

    s0 = torch.tensor(float(R.rank + 1))  # 0-d
    R.comm.all_reduce(s0, ReduceOp.SUM, async_op=False)
    R.check("all_reduce 0-d", s0, torch.tensor(float(n * (n + 1) // 2)))

    # all_gather into a list whose own slot is the input (in place)
    buf = torch.zeros(n * 3, dtype=I32)
    outs = list(buf.chunk(n))
    outs[R.rank].copy_(torch.full((3,), R.rank + 5, dtype=I32))
    R.comm.all_gather(outs, outs[R.rank], async_op=False)
    R.check("all_gather in place", buf,
            torch.cat([torch.full((3,), r + 5, dtype=I32) for r in range(n)]))

    # reduce_scatter_single in place: output is this rank's block of the input
    inp = torch.arange(n * 4, dtype=F64) + R.rank
    out = inp[R.rank * 4:(R.rank + 1) * 4]
    R.comm.reduce_scatter_single(out, inp, ReduceOp.SUM, async_op=False)
    R.check("reduce_scatter_single in place", out,
            sum(torch.arange(n * 4, dtype=F64)[R.rank * 4:(R.rank + 1) * 4] + r for r in range(n)))

    # a requires_grad leaf (communication writes through autograd's back)
    w = torch.ones(5, requires_grad=True)
    R.comm.all_reduce(w, ReduceOp.SUM, async_op=False)
    R.check("all_reduce requires_grad leaf", w.detach(), torch.full((5,), float(n)))
    g = torch.nn.Linear(3, 2)
    (g(torch.ones(1, 3)).sum() * (R.rank + 1)).backward()
    R.comm.all_reduce(g.weight.grad, ReduceOp.AVG, async_op=False)
    R.check("all_reduce .grad AVG", g.weight.grad,
            torch.full((2, 3), sum(r + 1 for r in range(n)) / n))

    # many async operations outstanding (the pending list is reaped)
    ts = [torch.full((3,), float(i)) for i in range(300)]
    works = [R.comm.all_reduce(t, ReduceOp.MAX, async_op=True) for t in ts]
    works[-1].wait()
    for w_ in works:
        w_.wait()
    R.check("300 outstanding", torch.stack(ts), torch.arange(300, dtype=F32)[:, None].expand(300, 3))


def c_gil(R):
    """Blocking calls release the GIL: a Python thread keeps running while
    rank 0 waits for a message that rank 1 sends 0.5 s later (and while it
    waits on the async work)."""
    if R.size < 2:
        return
    import threading

    for how in ("sync", "wait"):
        count = [0]
        stop = threading.Event()

        def spin():
            while not stop.is_set():
                count[0] += 1
                time.sleep(0.001)

        R.comm.barrier(async_op=False)
        if R.rank == 0:
            th = threading.Thread(target=spin)
            th.start()
            t = torch.zeros(4)
            t0 = time.monotonic()
            if how == "sync":
                R.comm.recv(t, 1, async_op=False)
            else:
                R.comm.recv(t, 1, async_op=True).wait()
            waited = time.monotonic() - t0
            stop.set()
            th.join()
            R.check(f"recv ({how}) value", t, torch.full((4,), 7.0))
            # ~1000 iterations per second of waiting when the GIL is free
            if waited > 0.3 and count[0] < 50:
                R.fail(f"GIL released ({how})",
                       f"the thread ran {count[0]} times during a {waited:.2f} s wait")
            else:
                R.check(f"GIL released ({how})", True, True)
        elif R.rank == 1:
            time.sleep(0.5)
            R.comm.send(torch.full((4,), 7.0), 0, async_op=False)


def c_threads(R):
    """Two Python threads, each driving its own communicator (split off the
    main one), with async and sync operations interleaved."""
    import threading

    comms = [R.comm.split(list(range(R.size)), f"thread{i}") for i in range(2)]
    errors = []

    def body(i, c):
        try:
            for j in range(40):
                t = torch.full((257,), float(R.rank + i + j))
                if j % 2:
                    c.all_reduce(t, ReduceOp.SUM, async_op=True).wait()
                else:
                    c.all_reduce(t, ReduceOp.SUM, async_op=False)
                exp = float(sum(r + i + j for r in range(R.size)))
                if not torch.equal(t, torch.full((257,), exp)):
                    errors.append(f"thread {i} op {j}: {t[0].item()} != {exp}")
                out = torch.zeros(R.size, dtype=I64)
                c.all_gather_single(out, torch.tensor([R.rank * 100 + j]), async_op=False)
                if out.tolist() != [r * 100 + j for r in range(R.size)]:
                    errors.append(f"thread {i} all_gather {j}: {out.tolist()}")
        except Exception:  # noqa: BLE001
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=body, args=(i, c)) for i, c in enumerate(comms)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    R.check("threads finished", [th.is_alive() for th in threads], [False, False])
    R.check("threads errors", errors, [])
    for c in comms:
        c.finalize()


def c_mismatch(R):
    """Ranks disagreeing on the size of a collective get RuntimeError (not a
    hang, not a crash, not a silently wrong result); run near the end, on a
    communicator split off for it, which every rank then aborts."""
    if R.size < 2:
        return
    for n_base, tag in ((4, "small"), (100_000, "large")):
        sub = R.comm.split(list(range(R.size)), f"mismatch_{tag}")
        t = torch.ones(n_base + R.rank)  # every rank a different count
        # the rank that detects the mismatch fails at once; its peers may
        # only notice at their deadline (the ring algorithms): TIMEDOUT then
        w = sub.all_reduce(t, ReduceOp.SUM, async_op=True, timeout=timedelta(seconds=3))
        t0 = time.monotonic()
        try:
            w.wait()
        except RuntimeError:
            R.check(f"mismatched count ({tag}) raises", True, True)
            R.check(f"mismatched count ({tag}) status", str(w.status()),
                    str(torchcomms.WorkStatus.ERROR)
                    if time.monotonic() - t0 < 2.5 else str(torchcomms.WorkStatus.TIMEDOUT))
        else:
            R.fail(f"mismatched count ({tag})", f"no error; result {t[:3].tolist()}")
        R.comm.barrier(async_op=False)
        sub.abort()


def c_timeout(R):
    """A receive nobody answers times out with RuntimeError (and status
    TIMEDOUT) after its own timeout, not the communicator's; run last, on a
    communicator split off for it, which every rank then aborts."""
    if R.size < 2:
        return
    sub = R.comm.split(list(range(R.size)), "timeout_victim")
    if R.rank == 0:
        t = torch.zeros(4)
        t0 = time.monotonic()
        w = sub.recv(t, 1, async_op=True, timeout=timedelta(seconds=1))
        try:
            w.wait()
        except RuntimeError as e:
            elapsed = time.monotonic() - t0
            R.check("timeout elapsed < 10 s", elapsed < 10, True)
            R.check("timeout message", "time" in str(e).lower(), True)
            R.check("status TIMEDOUT", str(w.status()), str(torchcomms.WorkStatus.TIMEDOUT))
        else:
            R.fail("recv timeout", "wait() returned without error")
        try:
            sub.barrier(async_op=False)
        except RuntimeError:
            R.check("later op on the failed communicator raises", True, True)
        else:
            R.fail("after timeout", "a later operation succeeded")
    R.comm.barrier(async_op=False)  # rank 0 is done with it
    sub.abort()
    R.check("aborted", sub.is_aborted(), True)


CATEGORIES = [
    ("info", c_info),
    ("all_reduce", c_all_reduce),
    ("rounding", c_rounding),
    ("reduce", c_reduce),
    ("broadcast", c_broadcast),
    ("send_recv", c_send_recv),
    ("all_gather", c_all_gather),
    ("all_gather_v", c_all_gather_v),
    ("all_gather_single", c_all_gather_single),
    ("reduce_scatter", c_reduce_scatter),
    ("reduce_scatter_v", c_reduce_scatter_v),
    ("reduce_scatter_single", c_reduce_scatter_single),
    ("all_to_all_single", c_all_to_all_single),
    ("all_to_all_v_single", c_all_to_all_v_single),
    ("all_to_all", c_all_to_all),
    ("barrier", c_barrier),
    ("scatter", c_scatter),
    ("gather", c_gather),
    ("gather_single", c_gather_single),
    ("batch", c_batch),
    ("split", c_split),
    ("async_many", c_async_many),
    ("options", c_options),
    ("errors_recover", c_errors_recover),
    ("aliases", c_aliases),
    ("views", c_views),
    ("gil", c_gil),
    ("threads", c_threads),
    ("mismatch", c_mismatch),
    ("timeout", c_timeout),  # last: leaves a communicator aborted
]


def main():
    outdir = sys.argv[1]
    only = set(sys.argv[2].split(",")) if len(sys.argv) > 2 and sys.argv[2] else None
    t0 = time.monotonic()
    comm = new_comm("cpu", torch.device("cpu"), name="collectives", timeout=TIMEOUT)
    R = Runner(comm)
    for name, fn in CATEGORIES:
        if only is None or name in only:
            R.run_category(name, fn)
    try:
        comm.finalize()
        comm.finalize()  # twice is harmless
    except Exception:
        R.category = "finalize"
        R.fail("finalize", traceback.format_exc())
    result = {"rank": R.rank, "size": R.size, "cases": R.cases, "times": R.times,
              "failures": R.failures,
              "elapsed": time.monotonic() - t0}
    os.makedirs(outdir, exist_ok=True)
    tmp = os.path.join(outdir, f".rank{R.rank}.json")
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, os.path.join(outdir, f"rank{R.rank}.json"))
    n = sum(R.cases.values())
    print(f"rank {R.rank}/{R.size}: {n} cases, {len(R.failures)} failures, "
          f"{result['elapsed']:.1f} s", flush=True)
    return 1 if R.failures else 0


if __name__ == "__main__":
    sys.exit(main())
