"""Shared launcher of the compatibility tests (tests/py/compat/).

Each area has a worker in workers/ (built on workers/compat_lib.py) and a test
file test_compat_<area>.py. A worker is launched ONCE per world size under
torchrun (2 and 4 ranks); every rank writes OUTDIR/rank<r>.json with the parts
it completed, the errors it found and its figures, and each test reads the
part it is about:

    def test_split_dup_ranks(n, compat):
        compat.part("contract", n, "split_dup_ranks")

`compat.run(area, n)` launches workers/<area>_worker.py (cached per session);
`compat.part(area, n, name)` asserts that `name` completed without error on
every rank and returns rank 0's figures.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TORCHRUN = Path(sys.executable).with_name("torchrun")
SIZES = [2, 4]
# Areas whose tests `make test-py-tcp` (TORCHCOMMS_CPU_TRANSPORT=tcp) skips
# (the shared-memory pass runs them; skipping keeps `make test` within its
# time): what they check does not depend on the transport: torch.compile
# tracing and autograd (functional), a Python backend's dispatch through the
# core (backends), argument checks, options and the split's agreement
# (contract). The collectives under them run on TCP in the other suites
# (tc_test's split refusals included). The c10d area (batches of MiB
# messages, monitored_barrier) runs on both.
TRANSPORT_INDEPENDENT = {"functional", "backends", "contract"}


def _tcp_pass():
    return os.environ.get("TORCHCOMMS_CPU_TRANSPORT") == "tcp"


def pytest_collection_modifyitems(config, items):
    if not _tcp_pass():
        return
    skip = pytest.mark.skip(reason="transport-independent: run in the shared-memory pass")
    for item in items:
        name = Path(str(item.fspath)).name
        if name.startswith("test_compat_") and name[12:-3] in TRANSPORT_INDEPENDENT:
            item.add_marker(skip)
# the launcher's and our own settings that must not leak in from the caller
LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
              "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
              "TORCHELASTIC_RUN_ID", "TORCHCOMM_RANK", "TORCHCOMM_SIZE",
              "TORCH_DISTRIBUTED_USE_TORCHCOMMS")


def clean_env(extra=None):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra or {})
    return env


def launch(cmd, env, timeout):
    """Runs a launcher in its own session; on timeout the whole group
    (launcher and ranks) is killed and returncode is None."""
    p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return subprocess.CompletedProcess(p.args, None, out,
                                           err + f"\n*** TIMEOUT after {timeout} s")
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


class Compat:
    def __init__(self, root):
        self.root = root
        self.results = {}

    def run(self, area, n, env=None, timeout=300, args=()):
        """The launch of workers/<area>_worker.py on n ranks (once per session,
        per distinct env/args): (returncode, per-rank results, log, seconds)."""
        if area in TRANSPORT_INDEPENDENT and _tcp_pass():
            pytest.skip(f"{area}: transport-independent, run in the shared-memory pass")
        key = (area, n, tuple(sorted((env or {}).items())), tuple(args))
        if key not in self.results:
            d = self.root / f"{area}-{n}-{len(self.results)}"
            d.mkdir()
            worker = HERE / "workers" / f"{area}_worker.py"
            t0 = time.monotonic()
            p = launch([TORCHRUN, "--standalone", f"--nproc_per_node={n}", worker, d, *args],
                       clean_env(env), timeout)
            log = (f"exit {p.returncode}\n--- stdout\n{p.stdout[-3000:]}\n"
                   f"--- stderr\n{p.stderr[-6000:]}")
            ranks = []
            for r in range(n):
                f = d / f"rank{r}.json"
                ranks.append(json.loads(f.read_text()) if f.exists() else None)
            self.results[key] = (p.returncode, ranks, log, time.monotonic() - t0)
        return self.results[key]

    def part(self, area, n, name, **kw):
        """Asserts that part `name` completed without error on every rank;
        returns rank 0's figures."""
        rc, ranks, log, _ = self.run(area, n, **kw)
        missing = [r for r, res in enumerate(ranks) if res is None]
        assert not missing, f"ranks {missing} wrote no result\n{log}"
        errors = [f"rank {r}: {e}" for r, res in enumerate(ranks) for e in res["errors"]
                  if e.startswith(f"[{name}]")]
        assert not errors, "\n".join(errors[:20])
        not_run = [r for r, res in enumerate(ranks) if name not in res["parts"]]
        assert not not_run, f"part {name} did not complete on ranks {not_run}\n{log}"
        return ranks[0]["figures"]

    def exit_ok(self, area, n, **kw):
        """The launch ended cleanly on every rank."""
        rc, ranks, log, secs = self.run(area, n, **kw)
        errors = [e for res in ranks if res for e in res["errors"]]
        assert rc == 0, "\n".join(errors[:10]) + "\n" + log
        return secs


@pytest.fixture(scope="session")
def compat(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("torchcomms._comms")
    return Compat(tmp_path_factory.mktemp("compat"))
