"""PyTorch integration: torch.distributed process groups over TorchComms.

Multi-rank parts run under torchrun with 2 and 4 ranks (CPU), the worker
being workers/torch_integration_worker.py; ONE launch per (mode, world size),
then one test per feature reads that launch's per-part results:

- "main": dist.init_process_group(backend="torchcomms") (registered through
  torchcomms.register_c10d_backend()):
  test_collectives (all_gather_into_tensor, reduce_scatter_tensor,
  all_to_all_single, broadcast, barrier, every ReduceOp incl. AVG and
  PREMUL_SUM, p2p, futures, coalesced, functional collectives),
  test_new_group_subgroups, test_ddp_matches_gloo (20 steps, parameters vs a
  gloo DDP run after every step, <= 1e-6), test_fsdp2_avg and
  test_fsdp2_premul_sum (20 steps, loss vs a single-process reference,
  <= 1e-5), test_device_mesh_2d (a 2 x N/2 mesh from TorchComm.split).
- "use_torchcomms": TORCH_DISTRIBUTED_USE_TORCHCOMMS=1 and
  init_process_group(backend="gloo"): torch's own path to torchcomms
  (test_use_torchcomms_path), with TORCHCOMMS_CPU_INLINE_BYTES=0 so that no
  operation completes on the caller's thread and futures are completed by
  the wrapper's helper thread.

Plus, in fresh interpreters: what torch.distributed imports from us, the
registration, and world size 1 details (new_comm's rank/size, errors, the
flight recorder).

Run: TC_BUILD_DIR=build .venv/bin/python -m pytest -q tests/py/test_torch_integration.py
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchcomms._comms")

HERE = Path(__file__).resolve().parent
WORKER = HERE / "workers" / "torch_integration_worker.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
              "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
              "TORCHELASTIC_RUN_ID", "TORCHCOMM_RANK", "TORCHCOMM_SIZE",
              "TORCH_DISTRIBUTED_USE_TORCHCOMMS", "TORCHCOMMS_CPU_INLINE_BYTES",
              "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
TIMEOUT = 240
SIZES = [2, 4]


def clean_env():
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    env["OMP_NUM_THREADS"] = "1"
    return env


def launch(cmd, env, timeout):
    """Runs a launcher in its own process group; on timeout the whole group
    (launcher and ranks) is killed and returncode is None."""
    p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return subprocess.CompletedProcess(p.args, None, out, err + f"\n*** TIMEOUT after {timeout} s")
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


_results = {}


@pytest.fixture(scope="module")
def outdir(tmp_path_factory):
    return tmp_path_factory.mktemp("torch_integration")


def run(mode, n, outdir):
    """The launch of `mode` on `n` ranks (once per session): per-rank results."""
    key = (mode, n)
    if key not in _results:
        env = clean_env()
        if mode == "use_torchcomms":
            env["TORCH_DISTRIBUTED_USE_TORCHCOMMS"] = "1"
            env["TORCHCOMMS_CPU_INLINE_BYTES"] = "0"  # futures completed while in flight
            env["TORCH_FR_BUFFER_SIZE"] = "16"  # torch attaches a FlightRecorderHook
        d = outdir / f"{mode}-{n}"
        d.mkdir()
        t0 = time.monotonic()
        p = launch([TORCHRUN, "--standalone", f"--nproc_per_node={n}", WORKER, mode, d],
                   env, TIMEOUT)
        log = f"exit {p.returncode}\n--- stdout\n{p.stdout[-3000:]}\n--- stderr\n{p.stderr[-6000:]}"
        ranks = []
        for r in range(n):
            f = d / f"{mode}-rank{r}.json"
            ranks.append(json.loads(f.read_text()) if f.exists() else None)
        _results[key] = (p.returncode, ranks, log, time.monotonic() - t0)
    return _results[key]


def part(mode, n, outdir, name):
    """Asserts that `name` ran without error on every rank; rank 0's figures."""
    rc, ranks, log, _ = run(mode, n, outdir)
    missing = [r for r, res in enumerate(ranks) if res is None]
    assert not missing, f"ranks {missing} wrote no result\n{log}"
    errors = [f"rank {r}: {e}" for r, res in enumerate(ranks) for e in res["errors"]
              if e.startswith(f"[{name}]")]
    assert not errors, "\n".join(errors[:20])
    not_run = [r for r, res in enumerate(ranks) if name not in res["parts"]]
    assert not not_run, f"part {name} did not complete on ranks {not_run}\n{log}"
    return ranks[0]["figures"]


def test_worker_exit(outdir):
    """Every launch ends cleanly (destroy_process_group included)."""
    for mode in ("main", "use_torchcomms"):
        for n in SIZES:
            rc, ranks, log, secs = run(mode, n, outdir)
            errors = [e for res in ranks if res for e in res["errors"]]
            assert rc == 0, f"{mode} on {n} ranks: " + "\n".join(errors[:10]) + "\n" + log
            print(f"{mode} x{n}: {secs:.1f} s")


@pytest.mark.parametrize("n", SIZES)
def test_collectives(n, outdir):
    fig = part("main", n, outdir, "collectives")
    assert fig["checks_collectives"] >= 45


@pytest.mark.parametrize("n", SIZES)
def test_new_group_subgroups(n, outdir):
    fig = part("main", n, outdir, "subgroups")
    assert fig["checks_subgroups"] >= 2


@pytest.mark.parametrize("n", SIZES)
def test_ddp_matches_gloo(n, outdir):
    fig = part("main", n, outdir, "ddp")
    diffs = fig["ddp_max_abs_diff_per_step"]
    print(f"DDP x{n}: max |param - gloo's| per step {diffs}; with the Python "
          f"allreduce_hook: {fig['ddp_hook_max_abs_diff']}")
    assert len(diffs) == 20 and max(diffs) <= 1e-6, diffs
    assert fig["ddp_hook_max_abs_diff"] <= 1e-6
    assert fig["ddp_allreduces_on_torchcomms"] >= 40


@pytest.mark.parametrize("n", SIZES)
def test_fsdp2_avg(n, outdir):
    fig = part("main", n, outdir, "fsdp")
    print(f"FSDP2 AVG x{n}: max |loss - reference| {fig['fsdp_avg_max_loss_diff']}, "
          f"max |param - reference| {fig['fsdp_avg_max_param_diff']}")
    assert len(fig["fsdp_avg_loss"]) == 20
    assert fig["fsdp_avg_max_loss_diff"] <= 1e-5
    assert fig["fsdp_avg_max_param_diff"] <= 1e-5


@pytest.mark.parametrize("n", SIZES)
def test_fsdp2_premul_sum(n, outdir):
    fig = part("main", n, outdir, "fsdp")
    print(f"FSDP2 PREMUL_SUM x{n}: max |loss - reference| {fig['fsdp_premul_max_loss_diff']}, "
          f"max |param - reference| {fig['fsdp_premul_max_param_diff']}")
    assert len(fig["fsdp_premul_loss"]) == 20
    assert fig["fsdp_premul_max_loss_diff"] <= 1e-5
    assert fig["fsdp_premul_max_param_diff"] <= 1e-5
    # a different gradient scale than AVG's: the runs must differ
    assert fig["fsdp_premul_loss"][1:] != fig["fsdp_avg_loss"][1:]


@pytest.mark.parametrize("n", SIZES)
def test_device_mesh_2d(n, outdir):
    fig = part("main", n, outdir, "mesh2d")
    assert fig["checks_mesh2d"] >= 13


@pytest.mark.parametrize("n", SIZES)
def test_use_torchcomms_path(n, outdir):
    part("use_torchcomms", n, outdir, "collectives")
    fig = part("use_torchcomms", n, outdir, "ddp_vs_reference")
    print(f"use_torchcomms DDP x{n}: max |param - reference| {fig['ddp_vs_reference_max_abs_diff']}")
    fig = part("use_torchcomms", n, outdir, "use_torchcomms")
    assert fig["checks_use_torchcomms"] >= 50
    assert fig["futures_deferred"] > 0


# --------------------------------------------------------------------------
# fresh interpreters, one process
# --------------------------------------------------------------------------

def py(code, timeout=120, env=None):
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=env or clean_env(), timeout=timeout)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_torch_distributed_imports_ours():
    """torch.distributed imports _BackendWrapper, new_comm and
    FlightRecorderHook from torchcomms; nothing is registered until asked."""
    r = py("""
import json, sys
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
before = "TORCHCOMMS" in dist.Backend._plugins
import torchcomms
torchcomms.register_c10d_backend()
torchcomms.register_c10d_backend()  # idempotent
print(json.dumps({"available": c10d._TORCHCOMM_AVAILABLE,
                  "wrapper": c10d._BackendWrapper.__module__,
                  "new_comm": c10d.new_comm is torchcomms.new_comm,
                  "hook": c10d.FlightRecorderHook.__module__,
                  "before": before, "after": "TORCHCOMMS" in dist.Backend._plugins,
                  "backend": dist.Backend("torchcomms"),
                  "cpu_default": dist.Backend.default_device_backend_map["cpu"],
                  "use": c10d._use_torchcomms_enabled()}))
""")
    assert r == {"available": True, "wrapper": "torchcomms._backend_wrapper", "new_comm": True,
                 "hook": "torchcomms.hooks", "before": False, "after": True,
                 "backend": "torchcomms", "cpu_default": "gloo", "use": False}, r


def test_hooks_import_without_torch():
    r = py("""
import json, sys
import torchcomms.hooks
from torchcomms import hooks
print(json.dumps({"torch": "torch" in sys.modules, "name": hooks.FlightRecorderHook.__name__}))
""")
    assert r == {"torch": False, "name": "FlightRecorderHook"}


WS1 = """
import json
from datetime import timedelta
import torch, torch.distributed as dist
import torchcomms
from torchcomms import new_comm, hooks
out = {}
c = new_comm("gloo", "cpu", name="a", rank=0, size=1)
out["gloo_alias"] = c.get_backend()
c.finalize()
for kw in ({"rank": 1, "size": 1}, {"rank": 0}, {"rank": -1, "size": 2}):
    try:
        new_comm("cpu", "cpu", name="b", **kw)
        out[str(kw)] = "accepted"
    except (ValueError, TypeError) as e:
        out[str(kw)] = type(e).__name__
torchcomms.register_c10d_backend()
dist.init_process_group(backend="torchcomms", store=dist.HashStore(), rank=0, world_size=1)
pg = dist.group.WORLD
rec = hooks.FlightRecorderHook(max_entries=3)
rec.register_with_comm(pg.get_comm())
t = torch.arange(4.0)
dist.all_reduce(t, op=dist.ReduceOp.AVG)
w = dist.all_reduce(t, async_op=True)
out["fut"] = w.get_future().wait()[0].tolist()
dist.broadcast(t, 0)
dist.barrier()
e = json.loads(rec.dump_json())["entries"]
out["fr"] = [x["profiling_name"] for x in e]
out["fr_state"] = [x["state"] for x in e]
out["fr_json"] = sorted(json.loads(rec.dump_json()))
out["fr_size"] = rec.size()
rec.unregister()
dist.barrier()
out["fr_after_unregister"] = [rec.size(), rec.is_enabled(), pg.get_comm()._fr_size()]
from torchcomms._backend_wrapper import _tc_op
for label, op in (("premul_no_factor", dist.ReduceOp.RedOpType.PREMUL_SUM),
                  ("unused_op", "bogus")):
    try:
        _tc_op(op)
        out[label] = "accepted"
    except ValueError as ex:
        out[label] = "ValueError"
out["premul_factor"] = repr(_tc_op(dist._make_nccl_premul_sum(0.25)))
out["name"] = pg.name()
out["group_name"] = pg.group_name
from torchcomms.device_mesh import init_device_mesh
mesh = init_device_mesh(mesh_dim_comms=(new_comm("cpu", "cpu", name="m"),), mesh_dim_names=("dp",))
mesh2 = init_device_mesh(mesh_dim_comms=(new_comm("cpu", "cpu", name="m2"),), mesh_dim_names=("dp",))
out["mesh_groups"] = [mesh.get_group().group_name, mesh2.get_group().group_name]
x = torch.ones(3)
dist.all_reduce(x, group=mesh2.get_group())
out["mesh_sum"] = x.tolist()
# torch 2.11 has no _register_pg_in_world: the same world entries by hand
import torch.distributed.distributed_c10d as _c10d
real = _c10d._register_pg_in_world
del _c10d._register_pg_in_world
try:
    mesh3 = init_device_mesh(mesh_dim_comms=(new_comm("cpu", "cpu", name="m3"),),
                             mesh_dim_names=("dp",))
finally:
    _c10d._register_pg_in_world = real
W = _c10d._world
def entries(g):
    return [W.pg_map[g][0], str(W.pg_names[g]), W.pg_group_ranks[g], W.pg_to_tag[g],
            W.tags_to_pg[W.pg_to_tag[g]].count(g), W.pg_backend_config[g],
            _c10d._resolve_process_group(W.pg_names[g]) is g]
out["world_entries"] = [entries(mesh2.get_group()), entries(mesh3.get_group())]
y = torch.ones(2)
dist.all_reduce(y, group=mesh3.get_group())
out["fallback_sum"] = y.tolist()
try:
    init_device_mesh(mesh_dim_comms=(pg.get_comm(), pg.get_comm()), mesh_dim_names=("a", "b"))
    out["2d_without_global"] = "accepted"
except RuntimeError:
    out["2d_without_global"] = "RuntimeError"
dist.destroy_process_group()
print(json.dumps(out))
"""


def test_world_size_1_details():
    env = clean_env()
    env["TORCH_FR_BUFFER_SIZE"] = "2"  # the C ring's size; the recorder's max_entries=3 grows it
    r = py(WS1, env=env)
    assert r["gloo_alias"] == "cpu"
    assert r["{'rank': 1, 'size': 1}"] == "ValueError"
    assert r["{'rank': 0}"] == "ValueError"
    assert r["{'rank': -1, 'size': 2}"] == "ValueError"
    assert r["fut"] == [0.0, 1.0, 2.0, 3.0]
    # the C library's ring of the communicator: TORCH_FR_BUFFER_SIZE=2 here,
    # grown to 3 by max_entries=3: the last 3 of the 4 operations
    assert r["fr"] == ["gloo:all_reduce", "gloo:broadcast", "gloo:barrier"], r
    assert r["fr_state"] == ["completed"] * 3, r
    assert r["fr_json"] == ["comm_lib_version", "entries", "pg_config", "pg_status", "rank",
                            "version"]
    assert r["fr_size"] == 3
    # unregistered: the recorder reads nothing; the ring goes on recording
    assert r["fr_after_unregister"] == [0, False, 3]
    assert r["premul_no_factor"] == "ValueError" and r["unused_op"] == "ValueError"
    assert "PREMUL_SUM" in r["premul_factor"] and "0.25" in r["premul_factor"], r["premul_factor"]
    assert r["name"] == "torchcomms" and r["group_name"] == "0"
    assert r["mesh_groups"] == ["dp", "dp_1"]
    assert r["mesh_sum"] == [1.0, 1.0, 1.0]
    # registered by torch's helper (mesh2) and by hand as on torch 2.11 (mesh3)
    e2, e3 = r["world_entries"]
    assert e2[1:4] == ["dp_1", {"0": 0}, "ptd:dp_1"], e2
    assert e3[1:4] == ["dp_2", {"0": 0}, "ptd:dp_2"], e3
    assert e2[0] == e3[0] and e2[4:] == e3[4:] == [1, e2[5], True], (e2, e3)
    assert r["fallback_sum"] == [1.0, 1.0]
    assert r["2d_without_global"] == "RuntimeError"


EXIT_RACE = """
import json
import torch
from torchcomms import new_comm
import torchcomms._backend_wrapper as bw

class InFlight:  # a TorchWork stand-in: not completed when its future is asked for
    def is_completed(self):
        return False

    def wait(self):
        pass

pg = bw._BackendWrapper(new_comm("cpu", "cpu", name="exit_race"))
t = [torch.ones(1)]
first = [bw._WorkWrapper(pg, [InFlight()], t).get_future() for _ in range(50)]
ok = all(f.wait()[0] is t[0] for f in first)
futs = [bw._WorkWrapper(pg, [InFlight()], t).get_future() for _ in range(20000)]
print(json.dumps({"deferred": pg._futures_deferred, "ok": ok}), flush=True)
# exits with the helper thread still completing futures
"""


def test_exit_with_futures_in_flight():
    """The futures' helper thread is joined at exit: a daemon thread still
    inside torch's Future.set_result when the interpreter finalizes ends the
    process with std::terminate ("terminate called without an active
    exception")."""
    for _ in range(2):
        p = subprocess.run([sys.executable, "-c", EXIT_RACE], capture_output=True, text=True,
                           env=clean_env(), timeout=120)
        assert p.returncode == 0 and "terminate" not in p.stderr, p.stdout + p.stderr
        r = json.loads(p.stdout.strip().splitlines()[-1])
        assert r == {"deferred": 20050, "ok": True}, r
