"""Python batch issues keep memory flat (issue 11, handles whose memory is
bounded): 60,000 batch_op_create / send / recv / issue cycles on 2 ranks
after a warm-up of 40,000; the resident set, and its private part, must grow
by less than 1 MiB on every rank. A batch handle, its list and its work are
slots reused from one issue to the next (src/core/handles.c); before batch
handles were slots, each issue left its freed batch behind (+5.6 MB over
60,000 issues).

The warm-up covers the shared-memory transport's first pass through its
rings (2 x 2 MiB per peer at the default TORCHCOMMS_SHM_BYTES): their pages
enter RSS once, as shared pages, and stay; after that nothing may grow.

Run: make pyinstall && TC_BUILD_DIR=build .venv/bin/python -m pytest -q tests/py/test_handles_rss.py
"""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).resolve().parent / "workers" / "batch_rss_worker.py"
ISSUES = 60000
BOUND_KIB = 1024


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(n):
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID", "TORCHCOMM_RANK",
                        "TORCHCOMM_SIZE", "LOCAL_RANK", "TORCHCOMMS_SHM_BYTES",
                        "TORCHCOMMS_CPU_TRANSPORT")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(n),
               OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(WORKER), "--issues", str(ISSUES)],
                              env=dict(env, RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(n)]
    results, outs = [], []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=240)
            outs.append(out)
            assert p.returncode == 0, out
            results += [json.loads(ln[9:]) for ln in out.splitlines()
                        if ln.startswith("BATCHRSS ")]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert len(results) == n, "\n".join(outs)
    return results


def test_batch_issues_keep_rss_flat():
    for res in run_ranks(2):
        (r0, r1), (p0, p1) = res["rss_kib"], res["private_kib"]
        print(f"rank {res['rank']}: {res['issues']} batch issues after {res['warmup']} in "
              f"{res['seconds']} s: RSS {r0} -> {r1} KiB ({r1 - r0:+d}), private "
              f"{p0} -> {p1} KiB ({p1 - p0:+d})")
        assert res["issues"] == ISSUES
        assert r1 - r0 < BOUND_KIB, res
        assert p1 - p0 < BOUND_KIB, res
