"""python -m torchcomms.perf (python/torchcomms/perf.py) launched by tcrun:
it prints tcperf's header and columns, verifies every result exactly (-z:
#wrong 0 on every row) and rejects bad arguments with exit status 2."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("TC_BUILD_DIR", ROOT / "build"))
TCRUN = BUILD / "tcrun"
COLUMNS = ["size", "count", "type", "redop", "root", "time(us)", "algbw(GB/s)",
           "busbw(GB/s)", "#wrong"]

try:
    _HAVE = importlib.util.find_spec("torchcomms._comms") is not None
except ImportError:
    _HAVE = False
pytestmark = pytest.mark.skipif(not _HAVE, reason="the torchcomms package is not importable")


def run(cmd, timeout=120):
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"):
        env.pop(k, None)
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                          timeout=timeout, env=env)


def perf(n, *args):
    return run([TCRUN, "-n", n, sys.executable, "-m", "torchcomms.perf", *args])


def check(out, coll, n, dtype, op, sizes):
    assert f"# torchcomms.perf: collective {coll}, ranks {n}, dtype {dtype}, op {op}," in out, out
    headers = [l[1:].split() for l in out.splitlines() if l.startswith("#")]
    assert COLUMNS in headers, out
    rows = [l.split() for l in out.splitlines() if l.strip() and not l.startswith("#")]
    assert len(rows) == len(sizes), out
    for row, size in zip(rows, sizes):
        assert len(row) == 9, out
        assert int(row[0]) == size and int(row[1]) > 0
        assert row[2] == dtype and row[3] == op
        assert float(row[5]) > 0 and float(row[6]) >= 0 and float(row[7]) >= 0
        assert row[8] == "0", out


def test_perf_all_reduce():
    p = perf(2, "-c", "all_reduce", "-b", "8", "-e", "1K", "-f", "4", "-n", "5", "-w", "1", "-z")
    assert p.returncode == 0, p.stdout + p.stderr
    check(p.stdout, "all_reduce", 2, "float32", "sum", [8, 32, 128, 512])


@pytest.mark.parametrize("coll,dtype,op,extra,sizes", [
    ("all_gather", "float32", "none", [], [60, 4092]),
    ("reduce_scatter", "int8", "bxor", [], [63, 4095]),
    ("broadcast", "bfloat16", "none", ["-r", "2"], [64, 4096]),
    ("reduce", "float16", "premul_sum", ["-r", "1"], [64, 4096]),
    ("all_reduce", "bfloat16", "avg", ["-m", "median"], [64, 4096]),
    ("all_reduce", "bool", "prod", [], [64, 4096]),
    ("all_to_all", "int64", "none", [], [48, 4080]),
    ("send_recv", "uint8", "none", [], [64, 4096]),
])
def test_perf_collectives_3_ranks(coll, dtype, op, extra, sizes):
    args = ["-c", coll, "-d", dtype, "-b", "64", "-e", "4K", "-f", "64", "-n", "3", "-w", "1", "-z"]
    if op != "none":
        args += ["-o", op]
    p = perf(3, *args, *extra)
    assert p.returncode == 0, p.stdout + p.stderr
    check(p.stdout, coll, 3, dtype, op, sizes)


EVERY_COLLECTIVE = [("all_reduce", "sum"), ("all_gather", "none"), ("reduce_scatter", "sum"),
                    ("broadcast", "none"), ("reduce", "sum"), ("all_to_all", "none"),
                    ("send_recv", "none")]


@pytest.mark.parametrize("mode", ["median", "avg"])
def test_perf_8_bytes_every_collective(mode):
    # the point the Python-vs-C comparison uses (docs/benchmarks.md): 8 B,
    # timed per call (median) and as a loop (avg), checked. The mode changes
    # only the timing around the same call (perf.py, time_one_size): every
    # collective per call, a one-tensor call and the batch as a loop (each
    # launch imports torch twice: about 3 s here)
    runs = EVERY_COLLECTIVE if mode == "median" else [EVERY_COLLECTIVE[0], EVERY_COLLECTIVE[-1]]
    for coll, op in runs:
        p = perf(2, "-c", coll, "-b", "8", "-e", "8", "-n", "50", "-w", "5", "-m", mode, "-z")
        assert p.returncode == 0, p.stdout + p.stderr
        check(p.stdout, coll, 2, "float32", op, [8])


def test_perf_csv(tmp_path):
    csv = tmp_path / "perf.csv"
    p = perf(2, "-c", "all_reduce", "-b", "8", "-e", "64", "-f", "8", "-n", "2", "-w", "0",
             "-z", "--csv", csv)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = csv.read_text().splitlines()
    assert lines[0].startswith("collective,ranks,size,count,type,redop,root,time_us,")
    assert lines[1].startswith("all_reduce,2,8,2,float32,sum,-1,")
    assert lines[2].startswith("all_reduce,2,64,16,float32,sum,-1,")
    assert len(lines) == 3


@pytest.mark.parametrize("args", [
    [], ["-c", "bogus"], ["-c", "all_reduce", "-b", "1X"], ["-c", "all_reduce", "-b", "1K", "-e", "8"],
    ["-c", "all_reduce", "-f", "1"], ["-c", "all_reduce", "-d", "float128"],
    ["-c", "all_reduce", "-o", "band"], ["-c", "all_reduce", "-d", "int32", "-o", "premul_sum"],
    ["-c", "all_reduce", "-n", "-1"], ["-c", "all_reduce", "--bogus"],
])
def test_perf_bad_args_exit_2(args):
    p = run([sys.executable, "-m", "torchcomms.perf", *args], timeout=60)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "usage:" in p.stderr
