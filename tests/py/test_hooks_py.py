"""TorchComm hooks (register_pre_hook / register_post_hook /
register_abort_hook, OpName, the argument classes, RemovableHandle), the
flight recorder hook and the NaN check.

Multi-rank parts run on 2 real processes under torchrun (the worker is
workers/hooks_worker.py; ONE launch, then one test per part reads that
launch's per-rank results; every check is exact and reported with got /
expected): direct TorchComm calls, torch.distributed over our c10d backend,
a pre hook that raises, a post hook that raises, removal, abort hooks, the
FlightRecorderHook and the NanCheckHook; plus a second launch where the
process aborts on a failed operation after its abort hook ran.
Single-process parts: the enum, the classes, the stub, imports.

Run: TC_BUILD_DIR=build .venv/bin/python -m pytest -q tests/py/test_hooks_py.py
"""

import ast
import gc
import json
import os
import signal
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchcomms._comms")
import torchcomms  # noqa: E402
from torchcomms import OpName, new_comm  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
WORKER = HERE / "workers" / "hooks_worker.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
              "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
              "TORCHELASTIC_RUN_ID", "TORCHCOMM_RANK", "TORCHCOMM_SIZE",
              "TORCH_DISTRIBUTED_USE_TORCHCOMMS", "TORCH_FR_BUFFER_SIZE",
              "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE",
              "TORCHCOMM_FR_DUMP_TEMP_FILE", "TORCHCOMM_FR_DUMP_DYNAMIC_FILE_NAME")
TIMEOUT = 240
PARTS = ["direct", "c10d", "pre_raise", "post_raise", "remove", "abort", "fr", "nan"]


def clean_env():
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    env["OMP_NUM_THREADS"] = "1"
    return env


def launch(args, env, timeout=TIMEOUT):
    p = subprocess.Popen([str(TORCHRUN), "--standalone", "--nproc_per_node=2", str(WORKER)]
                         + [str(a) for a in args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return None, out, err + f"\n*** TIMEOUT after {timeout} s"
    return p.returncode, out, err


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    d = tmp_path_factory.mktemp("hooks")
    env = clean_env()
    env["TORCH_FR_BUFFER_SIZE"] = "4"  # the C rings' default size in the worker
    rc, out, err = launch([d], env)
    log = f"exit {rc}\n--- stdout\n{out[-3000:]}\n--- stderr\n{err[-6000:]}"
    ranks = []
    for r in range(2):
        f = d / f"hooks-rank{r}.json"
        ranks.append(json.loads(f.read_text()) if f.exists() else None)
    return rc, ranks, log


@pytest.mark.parametrize("part", PARTS)
def test_part(results, part):
    rc, ranks, log = results
    for r, res in enumerate(ranks):
        assert res is not None, f"rank {r} wrote no results\n{log}"
        errors = [e for e in res["errors"] if e.startswith(f"[{part}]")]
        assert not errors, f"rank {r}:\n" + "\n".join(errors)
        assert part in res["parts"], f"rank {r} did not finish part {part}\n{log}"


def test_launch_exit(results):
    rc, ranks, log = results
    assert rc == 0, log


def test_op_ids_agree_across_ranks(results):
    """op_ids are per communicator and the same on both ranks for the same
    operations (the direct part ran on a fresh communicator whose first
    operation was a split, which takes two numbers (its two all_gather_single
    exchanges): its op_ids start at 3)."""
    _, ranks, _ = results
    d0, d1 = (r["data"] for r in ranks)
    assert d0["direct_op_ids"] == d1["direct_op_ids"] == list(range(3, 21))
    assert d0["c10d_op_ids"] == d1["c10d_op_ids"] == list(range(1, 7))
    # after rank 0's refused all_reduce, both ranks' next all_reduce has the
    # same op_id and collective sequence number
    assert d0["pre_raise"] == d1["pre_raise"]


def test_abort_hook_before_the_process_aborts(tmp_path):
    """abort_process_on_timeout_or_error=True: rank 0's all_reduce loses its
    peer; the abort hook runs (the communicator not yet aborted), then the
    process aborts (SIGABRT, reported by torchrun as exit code -6)."""
    rc, out, err = launch([tmp_path, "process_abort"], clean_env())
    assert rc not in (0, None), out + err
    marker = tmp_path / "abort-hook-rank0"
    assert marker.exists(), out + err
    assert marker.read_text() == "abort hook ran; aborted=False"
    assert "torchcomms: aborting the process (abort_process_on_timeout_or_error is set)" in err
    assert "exitcode  : -6" in err, err[-3000:]
    assert "rank 0 survived" not in out


# --------------------------------------------------------------------------
# one process
# --------------------------------------------------------------------------

NAMES = ["send", "recv", "broadcast", "all_reduce", "reduce", "all_gather", "all_gather_v",
         "all_gather_single", "reduce_scatter", "reduce_scatter_v", "reduce_scatter_single",
         "all_to_all_single", "all_to_all_v_single", "all_to_all", "barrier", "scatter",
         "gather", "gather_single", "split", "new_window", "finalize"]


def test_opname():
    assert [m.name for m in OpName] == NAMES + ["batch_op_issue"]
    assert str(OpName.all_reduce) == "OpName.all_reduce"
    assert str(OpName.finalize).rsplit(".", 1)[-1] == "finalize"
    assert OpName.__module__ == "torchcomms._comms"
    assert torchcomms.OpName is torchcomms._comms.OpName


def test_classes():
    C = torchcomms._comms
    a = C.AllReducePreHookArgs(torch.ones(1), False)
    with pytest.raises(AttributeError):
        a.tensor = None
    assert C.ScatterPreHookArgs._fields == ("output", "input", "root", "async_op")
    assert C.AllToAllVSinglePreHookArgs._fields == (
        "input", "output", "input_split_sizes", "output_split_sizes", "async_op")
    assert C.SplitPreHookArgs._fields == ("ranks", "name")
    assert C.FinalizePreHookArgs._fields == ()
    for n in ("CollectivePostHookArgs", "SplitPostHookArgs", "BatchOpIssuePostHookArgs",
              "FinalizePostHookArgs", "NewWindowPostHookArgs", "RemovableHandle", "OpName",
              "BatchOpIssuePreHookArgs", "GatherSinglePreHookArgs"):
        assert n in C.__all__, n
        assert getattr(C, n).__module__ == "torchcomms._comms", n
    with pytest.raises(AttributeError):
        C.CollectivePostHookArgs().x = 1  # no attributes
    with pytest.raises(TypeError):
        C.RemovableHandle()


def test_stub_declares_the_hook_api():
    tree = ast.parse((ROOT / "python" / "torchcomms" / "_comms.pyi").read_text())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    methods = {n.name for n in classes["TorchComm"].body if isinstance(n, ast.FunctionDef)}
    for m in ("register_pre_hook", "register_post_hook", "register_abort_hook"):
        assert m in methods and callable(getattr(torchcomms.TorchComm, m)), m
    members = [n.targets[0].id for n in classes["OpName"].body if isinstance(n, ast.Assign)]
    assert members == [m.name for m in OpName]
    for name, cls in classes.items():
        if name.endswith("PreHookArgs"):
            fields = tuple(n.target.id for n in cls.body if isinstance(n, ast.AnnAssign))
            assert fields == getattr(torchcomms._comms, name)._fields, name


def test_hooks_import_without_torch():
    code = ("import json, sys\n"
            "from torchcomms.hooks import FlightRecorderHook, NanCheckHook\n"
            "from torchcomms.hooks.nan_check import NanCheckHook as N2\n"
            "import torchcomms.hooks as h\n"
            "print(json.dumps([ 'torch' in sys.modules, N2 is NanCheckHook, h.__all__,\n"
            "                   FlightRecorderHook.__module__]))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=clean_env(), timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [False, True, ["FlightRecorderHook", "NanCheckHook"],
                                    "torchcomms.hooks"]


def test_world_size_1_details():
    c = new_comm("cpu", "cpu", name="hooks_ws1")
    seen = []
    t = torch.ones(2)
    h = c.register_pre_hook(lambda n, i, a: seen.append((n, i, a.tensor is t, a.async_op)))
    c.all_reduce(t, async_op=True).wait()
    assert seen == [(OpName.all_reduce, 1, True, True)]
    # keyword callback, repr
    h2 = c.register_post_hook(callback=lambda i, a: seen.append(i))
    assert repr(h2) == "<RemovableHandle post hook 2>"
    h.remove()
    h2.remove()
    assert repr(h2) == "<RemovableHandle post hook 2 (removed)>"
    # a failed operation calls no post hook (a pre hook was called)
    calls = []
    c.register_pre_hook(lambda n, i, a: calls.append(("pre", i)))
    c.register_post_hook(lambda i, a: calls.append(("post", i)))
    with pytest.raises(ValueError):
        c.send(torch.ones(1), 0)  # to itself: refused by the library
    assert calls == [("pre", 2)]
    assert c._next_op_id() == 2
    c.finalize()
    assert calls == [("pre", 2), ("pre", 2**64 - 1), ("post", 2**64 - 1)]


def test_hook_holding_its_comm_is_collected():
    """A hook that refers to its communicator makes a cycle the GC breaks
    (tp_clear drops the hooks)."""
    c = new_comm("cpu", "cpu", name="hooks_cycle")
    c.register_pre_hook(lambda n, i, a: c.get_rank())
    c.register_abort_hook(lambda: c.get_rank())
    c.barrier()
    c.finalize()
    ref = weakref.ref(c)
    del c
    gc.collect()
    assert ref() is None
