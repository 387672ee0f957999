"""torchcomms.perf -- the nccl-tests-style benchmark of tcperf, from Python.

    tcrun -n N python -m torchcomms.perf -c COLL [-b MIN] [-e MAX] [-f FACTOR]
        [-n ITERS] [-w WARMUP] [-d DTYPE] [-o OP] [-r ROOT] [-z]
        [-m avg|median] [-t TIMEOUT_S] [-B BACKEND] [--csv FILE]

(torchrun --nproc_per_node=N -m torchcomms.perf ... works too.) Same flags,
semantics and columns as the C tool build/tcperf (tools/tcperf.c), on torch
tensors through the package API (new_comm, TorchComm.all_reduce, ...,
batch_op_create for send_recv), so that the two measure the same thing and
their difference is the cost of the Python layer:

  -c  all_reduce | all_gather | reduce_scatter | broadcast | reduce |
      all_to_all | send_recv
  -b, -e  smallest / largest size in bytes (K, M, G suffixes, 1024-based;
      default 8 and 64M); -f  size multiplier (default 4). Sizes are those of
      the whole array (nccl-tests): all_gather, reduce_scatter and all_to_all
      use size / (element size * N) elements per rank.
  -n  timed iterations (default 20; 0: by size, 1000 below 64 KiB, 100 below
      4 MiB, 10 from 4 MiB, as the anchors in bench/ do); -w  warm-up iterations
      (default 5)
  -d  float32 (default) float64 float16 bfloat16 float8_e4m3fn float8_e5m2
      int8 uint8 int16 int32 int64 bool;  -o  sum prod min max avg band bor bxor premul_sum (0.5)
  -r  root of broadcast / reduce;  -z  check every output element exactly
      after the timed loop, on a fresh run (#wrong: summed over ranks)
  -m  avg: ITERS back-to-back calls timed as a whole (default); median: each
      call timed alone. The time reported is the maximum over ranks.

Rank 0 prints '#' header lines, then per size
  size count type redop root time(us) algbw(GB/s) busbw(GB/s) #wrong
with busbw = algbw x 2(n-1)/n (all_reduce), x (n-1)/n (all_gather,
reduce_scatter, all_to_all), x 1 (broadcast, reduce, send_recv).
Exit status: 0; 1 when -z found wrong elements; 2 on bad usage.
"""
import argparse
import datetime
import functools
import re
import sys
import time

COLLS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
         "all_to_all", "send_recv")
REDUCTIONS = ("all_reduce", "reduce_scatter", "reduce")
DTYPES = ("float32", "float64", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2",
          "int8", "uint8", "int16", "int32", "int64", "bool")
DTYPE_ALIASES = {"float": "float32", "double": "float64", "half": "float16",
                 "bf16": "bfloat16", "int": "int32", "long": "int64"}
OPS = {"sum": "SUM", "prod": "PRODUCT", "product": "PRODUCT", "min": "MIN",
       "max": "MAX", "avg": "AVG", "band": "BAND", "bor": "BOR", "bxor": "BXOR",
       "premul_sum": "PREMUL_SUM"}
FLOAT8 = ("float8_e4m3fn", "float8_e5m2")
FLOATS = ("float32", "float64", "float16", "bfloat16") + FLOAT8
PREMUL_FACTOR = 0.5  # exact in every float type


def iters_by_size(nbytes):
    """Timed iterations for -n 0, as the anchor benchmarks in bench/ choose."""
    return 1000 if nbytes < 64 << 10 else (100 if nbytes < 4 << 20 else 10)


def parse_size(s):
    """'64M' -> 67108864 (K, M, G are powers of 1024; a trailing B is allowed)."""
    m = re.fullmatch(r"(\d+)([kKmMgG]?)[bB]?", s.strip())
    if not m or int(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(
            f"bad size '{s}' (a positive number of bytes, e.g. 8, 1K, 64M)")
    return int(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()]


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m torchcomms.perf",
        description="nccl-tests-style benchmark of torchcomms (tcperf's flags)")
    p.add_argument("-c", dest="coll", required=True, choices=COLLS)
    p.add_argument("-b", dest="minb", type=parse_size, default=None)
    p.add_argument("-e", dest="maxb", type=parse_size, default=None)
    p.add_argument("-f", dest="factor", type=int, default=4)
    p.add_argument("-n", dest="iters", type=int, default=20)
    p.add_argument("-w", dest="warmup", type=int, default=5)
    p.add_argument("-d", dest="dtype", default="float32")
    p.add_argument("-o", dest="op", default="sum", choices=sorted(OPS))
    p.add_argument("-r", dest="root", type=int, default=0)
    p.add_argument("-z", dest="check", action="store_true")
    p.add_argument("-m", dest="mode", default="avg", choices=("avg", "median"))
    p.add_argument("-t", dest="timeout", type=float, default=None)
    p.add_argument("-B", dest="backend", default="cpu")
    p.add_argument("--csv", default=None)
    a = p.parse_args(argv)
    a.dtype = DTYPE_ALIASES.get(a.dtype, a.dtype)
    if a.dtype not in DTYPES:
        p.error(f"unknown dtype '{a.dtype}' (one of {', '.join(DTYPES)})")
    if a.factor < 2:
        p.error(f"bad factor {a.factor} (an integer >= 2)")
    if a.iters < 0 or a.warmup < 0:
        p.error("-n must be >= 0 (0: by size) and -w >= 0")
    if a.root < 0:
        p.error(f"bad root {a.root}")
    if a.timeout is not None and not a.timeout > 0:
        p.error(f"bad timeout {a.timeout} (seconds > 0)")
    if a.minb is None and a.maxb is None:
        a.minb, a.maxb = 8, 64 << 20
    elif a.maxb is None:
        a.maxb = a.minb
    elif a.minb is None:
        a.minb = min(8, a.maxb)
    if a.maxb < a.minb:
        p.error("-e MAX is smaller than -b MIN")
    if a.coll in REDUCTIONS:
        if a.op in ("band", "bor", "bxor") and a.dtype in FLOATS:
            p.error(f"op {a.op} needs an integer or bool dtype")
        if a.op == "premul_sum" and a.dtype not in FLOATS:
            p.error(f"op {a.op} needs a floating-point dtype")
        if a.op == "avg" and a.dtype == "bool":
            p.error(f"op {a.op} is not defined on bool")
    if a.op == "product":
        a.op = "prod"
    return a


class Bench:
    """One benchmark: the communicator, the buffers and the per-size layout."""

    def __init__(self, a):
        import torch
        import torchcomms

        self.a, self.torch, self.tc = a, torch, torchcomms
        kw = {"name": "perf"}
        if a.timeout is not None:
            kw["timeout"] = datetime.timedelta(seconds=a.timeout)
        self.comm = torchcomms.new_comm(a.backend, torch.device("cpu"), **kw)
        self.rank, self.n = self.comm.get_rank(), self.comm.get_size()
        self.dt = getattr(torch, a.dtype)
        self.es = torch.empty(0, dtype=self.dt).element_size()
        R = torchcomms.ReduceOp
        self.op = R.PREMUL_SUM(PREMUL_FACTOR) if a.op == "premul_sum" else getattr(R, OPS[a.op])
        self.maxop, self.sumop = R.MAX, R.SUM

    # ---- layout and values ----

    def layout(self, nbytes):
        """Sets count, in_elems, out_elems (0: in place); returns bytes moved."""
        c, es, n = self.a.coll, self.es, self.n
        if c in ("all_gather", "reduce_scatter", "all_to_all"):
            self.count = max(nbytes // (es * n), 1)
            self.in_elems = self.count if c == "all_gather" else self.count * n
            self.out_elems = self.count if c == "reduce_scatter" else self.count * n
            return self.count * n * es
        self.count = max(nbytes // es, 1)
        self.in_elems = self.count
        self.out_elems = self.count if c == "send_recv" else 0
        return self.count * es

    def pattern(self, r, idx):
        """int64 values of rank r's input at indices idx (tools/tcperf.c's)."""
        a, b = self.a, self.a.dtype == "bool"
        if a.coll not in REDUCTIONS:
            return (idx + r) % 2 if b else (idx * 13 + r * 7 + 1) % 61
        if a.op == "prod":
            return ((idx + r) % 5 != 0).long() if b else 1 + ((idx + r) % 4 == 0).long()
        if a.op in ("min", "max"):
            return (idx + r) % 2 if b else (idx * 7 + r * 3) % 16
        if a.op in ("band", "bor", "bxor"):
            return (idx + r) % 2 if b else (idx * 5 + r * 11) % 64
        if a.dtype in FLOAT8:  # sums of 0..1: exact up to 8 ranks
            return (idx * 3 + r * 5) % 2
        return ((idx + r) % 3 == 0).long() if b else (idx * 3 + r * 5) % 4

    def values(self, r, idx):
        v = self.pattern(r, idx)
        return v.to(self.torch.float64).to(self.dt) if self.a.dtype in FLOATS else v.to(self.dt)

    def reference(self, idx):
        """The reduction over ranks at indices idx, as the library defines it."""
        torch, a, n = self.torch, self.a, self.n
        vals = [self.pattern(r, idx) for r in range(n)]
        if a.dtype == "bool":
            acc = vals[0] != 0
            for v in vals[1:]:
                v = v != 0
                if a.op in ("sum", "max", "bor"):
                    acc = acc | v
                elif a.op == "bxor":
                    acc = acc ^ v
                else:
                    acc = acc & v
            return acc
        if a.dtype in FLOATS:
            vals = [v.to(torch.float64) for v in vals]
            scale = PREMUL_FACTOR if a.op == "premul_sum" else 1.0
            acc = vals[0] * scale
            for v in vals[1:]:
                if a.op == "prod":
                    acc = acc * v
                elif a.op == "min":
                    acc = torch.minimum(acc, v)
                elif a.op == "max":
                    acc = torch.maximum(acc, v)
                else:
                    acc = acc + v * scale
            if a.op == "avg":
                acc = acc / n if a.dtype == "float64" else (acc.to(torch.float32) / n).to(torch.float64)
            return acc.to(self.dt)
        acc = vals[0]
        for v in vals[1:]:
            if a.op == "prod":
                acc = acc * v
            elif a.op == "min":
                acc = torch.minimum(acc, v)
            elif a.op == "max":
                acc = torch.maximum(acc, v)
            elif a.op == "band":
                acc = acc & v
            elif a.op == "bor":
                acc = acc | v
            elif a.op == "bxor":
                acc = acc ^ v
            else:
                acc = acc + v
        if a.op == "avg":  # the wrapped sum, divided truncating toward zero
            acc = torch.div(acc.to(self.dt).to(torch.int64), n, rounding_mode="trunc")
        return acc.to(self.dt)

    # ---- buffers and the operation ----

    def setup(self, nbytes):
        torch = self.torch
        moved = self.layout(nbytes)
        self.inp = self.values(self.rank, torch.arange(self.in_elems))
        self.out = torch.zeros(self.out_elems, dtype=self.dt) if self.out_elems else None
        self.method, self.args = self.make_call()
        self.fn = functools.partial(self.method, *self.args)
        return moved

    def make_call(self):
        """The bound method and positional arguments of one synchronous
        operation (the same buffers every call, as tcperf)."""
        c, comm, a = self.a.coll, self.comm, self.a
        if c == "all_reduce":
            return comm.all_reduce, (self.inp, self.op, False)
        if c == "broadcast":
            return comm.broadcast, (self.inp, a.root, False)
        if c == "reduce":
            return comm.reduce, (self.inp, a.root, self.op, False)
        if c == "all_gather":
            return comm.all_gather_single, (self.out, self.inp, False)
        if c == "reduce_scatter":
            return comm.reduce_scatter_single, (self.out, self.inp, self.op, False)
        if c == "all_to_all":
            return comm.all_to_all_single, (self.out, self.inp, False)
        batch = comm.batch_op_create()
        batch.send(self.inp, (self.rank + 1) % self.n)
        batch.recv(self.out, (self.rank - 1) % self.n)
        return batch.issue, (False,)

    def time_one_size(self, nbytes):
        a, fn = self.a, self.fn
        iters = a.iters or iters_by_size(nbytes)
        for _ in range(a.warmup):
            fn()
        self.comm.barrier(False)
        if a.mode == "avg":
            t = timed_loop(self.method, self.args, iters, None) / iters
        else:
            s = [0.0] * iters
            timed_loop(self.method, self.args, iters, s)
            s.sort()
            m = len(s) // 2
            t = s[m] if len(s) % 2 else 0.5 * (s[m - 1] + s[m])
        x = self.torch.tensor([t], dtype=self.torch.float64)
        self.comm.all_reduce(x, self.maxop, False)
        return x.item()

    def verify(self):
        """Refills the inputs, runs once and returns this rank's wrong count."""
        torch, a, r, n, cnt = self.torch, self.a, self.rank, self.n, self.count
        self.inp.copy_(self.values(r, torch.arange(self.in_elems)))
        if a.coll == "broadcast" and r != a.root:
            self.inp.view(torch.uint8).fill_(255)
        if self.out is not None:
            self.out.view(torch.uint8).fill_(255)
        self.fn()
        got = self.out if self.out is not None else self.inp
        j = torch.arange(got.numel())
        if a.coll == "all_reduce":
            exp = self.reference(j)
        elif a.coll == "reduce":
            exp = self.reference(j) if r == a.root else self.values(r, j)
        elif a.coll == "reduce_scatter":
            exp = self.reference(r * cnt + j)
        elif a.coll == "broadcast":
            exp = self.values(a.root, j)
        elif a.coll in ("all_gather", "all_to_all"):
            src, k = j // cnt, j % cnt
            if a.coll == "all_to_all":
                k = r * cnt + k
            exp = torch.empty_like(got)
            for s in range(n):  # pattern() takes one rank at a time
                m = src == s
                exp[m] = self.values(s, k[m])
        else:  # send_recv: from rank r - 1
            exp = self.values((r - 1) % n, j)
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[self.es]
        return int((got.view(bits) != exp.view(bits)).sum().item())


def timed_loop(m, args, iters, samples):
    """Calls m(*args) iters times. samples None: returns the seconds of the
    whole loop; else samples[i] = seconds of call i. What is timed is the
    call alone: the arguments are locals, spelled out per arity (no
    functools.partial or *args in the timed region), the samples list is
    preallocated, so each iteration adds only the clock reads to what
    tcperf times."""
    clock, n = time.perf_counter, len(args)
    if samples is None:
        t0 = clock()
        if n == 1:
            (a0,) = args
            for _ in range(iters):
                m(a0)
        elif n == 3:
            a0, a1, a2 = args
            for _ in range(iters):
                m(a0, a1, a2)
        elif n == 4:
            a0, a1, a2, a3 = args
            for _ in range(iters):
                m(a0, a1, a2, a3)
        else:
            for _ in range(iters):
                m(*args)
        return clock() - t0
    if n == 1:
        (a0,) = args
        for i in range(iters):
            t0 = clock()
            m(a0)
            samples[i] = clock() - t0
    elif n == 3:
        a0, a1, a2 = args
        for i in range(iters):
            t0 = clock()
            m(a0, a1, a2)
            samples[i] = clock() - t0
    elif n == 4:
        a0, a1, a2, a3 = args
        for i in range(iters):
            t0 = clock()
            m(a0, a1, a2, a3)
            samples[i] = clock() - t0
    else:
        for i in range(iters):
            t0 = clock()
            m(*args)
            samples[i] = clock() - t0
    return None


def main(argv=None):
    a = parse_args(argv)
    B = Bench(a)
    torch, n = B.torch, B.n
    if a.root >= n:
        if B.rank == 0:
            print(f"torchcomms.perf: root {a.root} is not a rank (size {n})", file=sys.stderr)
        B.comm.finalize()
        return 2
    rooted = a.coll in ("broadcast", "reduce")
    opname = a.op if a.coll in REDUCTIONS else "none"
    factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n,
              "reduce_scatter": (n - 1) / n, "all_to_all": (n - 1) / n}.get(a.coll, 1.0)
    csv = None
    if B.rank == 0:
        if a.csv:
            csv = open(a.csv, "w")
            csv.write("collective,ranks,size,count,type,redop,root,time_us,"
                      "algbw_GBps,busbw_GBps,wrong\n")
        print(f"# torchcomms.perf: collective {a.coll}, ranks {n}, dtype {a.dtype}, "
              f"op {opname}, backend {a.backend} ({B.comm.get_backend_version()})")
        timing = "median per iteration" if a.mode == "median" else "average of back-to-back loop"
        print(f"# iters {a.iters or 'by size'}, warmup {a.warmup}, timing {timing} (max over ranks), "
              f"check {'on' if a.check else 'off'}, torch {torch.__version__}, "
              f"python {sys.version.split()[0]}")
        print(f"#\n# {'size':>10} {'count':>12} {'type':>9} {'redop':>6} {'root':>5} "
              f"{'time(us)':>12} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'#wrong':>7}",
              flush=True)
    bus, rows, wrong_total = 0.0, 0, 0
    b = a.minb
    while b <= a.maxb:
        moved = B.setup(b)
        t = B.time_one_size(b)
        wrong = "N/A"
        if a.check:
            w = torch.tensor([B.verify()], dtype=torch.int64)
            B.comm.all_reduce(w, B.sumop, False)
            wrong = int(w.item())
            wrong_total += wrong
        alg = moved / t / 1e9
        bus += alg * factor
        rows += 1
        if B.rank == 0:
            root = a.root if rooted else -1
            print(f"  {moved:>10} {B.count:>12} {a.dtype:>9} {opname:>6} {root:>5} "
                  f"{t * 1e6:>12.2f} {alg:>12.3f} {alg * factor:>12.3f} {wrong:>7}",
                  flush=True)
            if csv:
                csv.write(f"{a.coll},{n},{moved},{B.count},{a.dtype},{opname},{root},"
                          f"{t * 1e6:.3f},{alg:.4f},{alg * factor:.4f},{wrong}\n")
        b *= a.factor
    if B.rank == 0:
        print(f"# Avg bus bandwidth: {bus / max(rows, 1):.3f} GB/s")
        if a.check:
            print(f"# Wrong elements: {wrong_total} {'FAILED' if wrong_total else 'OK'}")
        sys.stdout.flush()
    if csv:
        csv.close()
    B.fn = None
    B.comm.finalize()
    return 1 if wrong_total else 0


if __name__ == "__main__":
    sys.exit(main())
