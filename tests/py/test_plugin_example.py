"""The example out-of-tree backend (examples/plugin/loopback.c, built by CMake
as build/plugins/libtorchcomms-loopback.so) from Python, loaded by name with
``torchcomms.new_comm("loopback", "cpu")`` through
TORCHCOMMS_BACKEND_LIB_PATH_LOOPBACK: every operation on torch tensors of
every dtype (exact values), asynchronous completion and issue order, the
plugin's errors (world size 2 at create, PREMUL_SUM on float16, a timeout,
abort), and the template's own standalone build: installed torchcomms +
pkg-config + examples/plugin/Makefile (or its CMakeLists.txt), the plugin found beside the installed
libtorchcomms, and the standalone .so loaded from Python.

Run: make build pyinstall &&
     TC_BUILD_DIR=build .venv/bin/python -m pytest -q tests/py/test_plugin_example.py
"""
import os
import shutil
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch

import torchcomms
from torchcomms import ReduceOp, WorkStatus

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("TC_BUILD_DIR", ROOT / "build")).resolve()
PLUGIN_DIR = BUILD / "plugins"
ENV_VAR = "TORCHCOMMS_BACKEND_LIB_PATH_LOOPBACK"
LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
              "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID",
              "TORCHCOMM_RANK", "TORCHCOMM_SIZE")
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
          torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool]


@pytest.fixture(autouse=True)
def plugin_env(monkeypatch):
    assert (PLUGIN_DIR / "libtorchcomms-loopback.so").exists(), "run make build first"
    for k in LAUNCH_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv(ENV_VAR, str(PLUGIN_DIR))


@pytest.fixture
def lb(plugin_env):
    c = torchcomms.new_comm("loopback", "cpu", name="lb")
    yield c
    c.finalize()


def vals(dtype, n=6):
    return (torch.arange(n) % 4 + 1).to(dtype)


def done(w):
    assert isinstance(w, torchcomms.TorchWork)
    w.wait()
    assert w.is_completed() and w.status() is WorkStatus.COMPLETED


def test_identity(lb):
    assert lb.get_backend() == "loopback"
    assert lb.get_backend_version() == "1.0.0"
    assert lb.get_rank() == 0 and lb.get_size() == 1 and lb.get_name() == "lb"
    assert lb.get_device() == torch.device("cpu")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("a", [False, True], ids=["sync", "async"])
def test_every_op_every_dtype(lb, dtype, a):
    ops = [ReduceOp.SUM, ReduceOp.MAX] + ([ReduceOp.AVG] if dtype != torch.bool else [])
    for op in ops:
        t = vals(dtype)
        done(lb.all_reduce(t, op, a))
        assert torch.equal(t, vals(dtype)), op
        t = vals(dtype)
        done(lb.reduce(t, 0, op, a))
        assert torch.equal(t, vals(dtype)), op
    if dtype in (torch.float32, torch.float64):
        t = vals(dtype)
        done(lb.all_reduce(t, ReduceOp.PREMUL_SUM(2.5), a))
        assert torch.equal(t, vals(dtype) * 2.5)
        out = torch.zeros(6, dtype=dtype)
        done(lb.reduce_scatter_single(out, vals(dtype), ReduceOp.PREMUL_SUM(-1.0), a))
        assert torch.equal(out, -vals(dtype))
    t = vals(dtype)
    done(lb.broadcast(t, 0, a))
    assert torch.equal(t, vals(dtype))
    out = [torch.zeros(6, dtype=dtype)]
    done(lb.all_gather(out, vals(dtype), a))
    assert torch.equal(out[0], vals(dtype))
    out = [torch.zeros(6, dtype=dtype)]
    done(lb.all_gather_v(out, vals(dtype), a))
    assert torch.equal(out[0], vals(dtype))
    out = torch.zeros(6, dtype=dtype)
    done(lb.all_gather_single(out, vals(dtype), a))
    assert torch.equal(out, vals(dtype))
    out = torch.zeros(6, dtype=dtype)
    done(lb.reduce_scatter(out, [vals(dtype)], ReduceOp.SUM, a))
    assert torch.equal(out, vals(dtype))
    out = torch.zeros(6, dtype=dtype)
    done(lb.reduce_scatter_v(out, [vals(dtype)], ReduceOp.MAX, a))
    assert torch.equal(out, vals(dtype))
    out = torch.zeros(6, dtype=dtype)
    done(lb.all_to_all_single(out, vals(dtype), a))
    assert torch.equal(out, vals(dtype))
    out = torch.zeros(3, 2, dtype=dtype)
    done(lb.all_to_all_v_single(out, vals(dtype).reshape(3, 2), [3], [3], a))
    assert torch.equal(out, vals(dtype).reshape(3, 2))
    out = [torch.zeros(6, dtype=dtype)]
    done(lb.all_to_all(out, [vals(dtype)], a))
    assert torch.equal(out[0], vals(dtype))
    done(lb.barrier(a))
    out = torch.zeros(6, dtype=dtype)
    done(lb.scatter(out, [vals(dtype)], 0, a))
    assert torch.equal(out, vals(dtype))
    out = [torch.zeros(6, dtype=dtype)]
    done(lb.gather(out, vals(dtype), 0, a))
    assert torch.equal(out[0], vals(dtype))
    out = torch.zeros(6, dtype=dtype)
    done(lb.gather_single(out, vals(dtype), 0, a))
    assert torch.equal(out, vals(dtype))
    b = lb.batch_op_create()
    out = torch.zeros(6, dtype=dtype)
    b.send(vals(dtype), 0)
    b.recv(out, 0)
    done(b.issue(a))
    assert torch.equal(out, vals(dtype))


def test_async_and_issue_order(lb):
    """The op entries only queue: a delayed operation returns at once, and
    the next one, queued behind it, sees its result."""
    x = torch.arange(8, dtype=torch.int32)
    y = torch.zeros(8, dtype=torch.int32)
    z = torch.zeros(8, dtype=torch.int32)
    t0 = time.monotonic()
    w1 = lb.all_gather_single(y, x, True, hints={"loopback.delay_ms": "200"})
    w2 = lb.all_gather_single(z, y, async_op=True)
    assert time.monotonic() - t0 < 0.15
    assert not w1.is_completed() and not w2.is_completed()
    w2.wait()
    assert w1.is_completed() and w1.status() is WorkStatus.COMPLETED
    assert time.monotonic() - t0 >= 0.19
    assert torch.equal(z, x)


def test_split(lb):
    child = lb.split([0], "lb_child")
    assert child.get_backend() == "loopback" and child.get_size() == 1
    t = torch.tensor([1.0, -2.0], dtype=torch.float64)
    child.all_reduce(t, ReduceOp.PREMUL_SUM(4.0))
    assert t.tolist() == [4.0, -8.0]
    child.finalize()


def test_errors(lb):
    # reported by the plugin through the work, naming op, comm, rank
    h = torch.ones(2, dtype=torch.float16)
    with pytest.raises(RuntimeError, match=r"^torchcomms: all_reduce on 'lb' \(rank 0 of 1\): "
                       r"loopback: PREMUL_SUM on float16 is not implemented"):
        lb.all_reduce(h, ReduceOp.PREMUL_SUM(2.0))
    assert h.tolist() == [1.0, 1.0]
    w = lb.all_to_all_v_single(torch.zeros(3, 2), torch.ones(2, 2), [3], [2], True)
    with pytest.raises(RuntimeError, match="loopback: rank 0 sends 4 elements to itself "
                       "but expects to receive 6"):
        w.wait()
    assert w.status() is WorkStatus.ERROR
    # the plugin's own timeout, at the operation's deadline
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"barrier on 'lb' \(rank 0 of 1\): loopback: "
                       r"timed out after 0\.200 s"):
        lb.barrier(hints={"loopback.delay_ms": "10000"}, timeout=timedelta(seconds=0.2))
    assert time.monotonic() - t0 < 3
    # still usable
    t = torch.ones(3)
    lb.all_reduce(t, ReduceOp.PREMUL_SUM(3.0))
    assert t.tolist() == [3.0, 3.0, 3.0]


def test_world_size_2_is_refused(monkeypatch):
    from torch.distributed import HashStore

    monkeypatch.setenv("TORCHCOMM_RANK", "0")
    monkeypatch.setenv("TORCHCOMM_SIZE", "2")
    with pytest.raises(RuntimeError, match=r"tc_comm_create on 'two' \(rank 0 of 2\): backend "
                       r"'loopback' failed to start: the loopback backend runs a world of "
                       r"one rank only \(got world size 2\)"):
        torchcomms.new_comm("loopback", "cpu", name="two", store=HashStore())


def test_abort_fails_pending_work():
    c = torchcomms.new_comm("loopback", "cpu", name="abt")
    t = torch.ones(4)
    w1 = c.all_reduce(t, ReduceOp.PREMUL_SUM(2.0), True, hints={"loopback.delay_ms": "20000"})
    w2 = c.barrier(True)
    t0 = time.monotonic()
    c.abort()
    assert c.is_aborted()
    for w in (w1, w2):
        with pytest.raises(RuntimeError, match="loopback: communicator was aborted"):
            w.wait()
    assert time.monotonic() - t0 < 2
    assert t.tolist() == [1.0] * 4


def test_not_found_names_the_variable(tmp_path):
    # its own process: this one's loader has cached "loopback" already
    code = ("import torchcomms\n"
            "try:\n"
            "    torchcomms.new_comm('loopback', 'cpu')\n"
            "except RuntimeError as e:\n"
            "    print(e)\n")
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    env[ENV_VAR] = str(tmp_path)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"torchcomms: backend 'loopback' not found: tried {tmp_path}"
                               "/libtorchcomms-loopback.so (No such file or directory), "), r.stdout
    assert f"set {ENV_VAR} to the path of libtorchcomms-loopback.so" in r.stdout


def test_standalone_build_with_pkg_config(tmp_path):
    """The template as a user gets it: an installed torchcomms, a copy of
    examples/plugin/, `make` (and cmake) through pkg-config. The plugin links nothing
    but libc, exports only tc_backend_table, runs under the C demo (found by
    the variable, then beside the installed libtorchcomms after `make
    install`) and from Python."""
    for tool in ("make", "pkg-config", "cc"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is not installed")
    prefix = tmp_path / "prefix"
    p = subprocess.run(["cmake", "--install", str(BUILD), "--prefix", str(prefix)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    libdir = next(prefix.glob("lib*/libtorchcomms.so.0")).parent
    src = tmp_path / "plugin"
    shutil.copytree(ROOT / "examples" / "plugin", src,
                    ignore=shutil.ignore_patterns("*.so", "demo"))
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV and k != ENV_VAR}
    env["PKG_CONFIG_PATH"] = str(libdir / "pkgconfig")
    env["CFLAGS"] = "-O1 -Werror"

    def make(*args):
        r = subprocess.run(["make", "-C", str(src), *args], capture_output=True, text=True,
                           env=env, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    make()
    so = src / "libtorchcomms-loopback.so"
    needed = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True).stdout
    assert "libtorchcomms" not in needed, needed
    nm = subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True,
                        text=True).stdout
    assert [line.split()[-1] for line in nm.splitlines()] == ["tc_backend_table"], nm

    # the same with the template's own CMakeLists.txt
    bdir = tmp_path / "cmake-build"
    for cmd in (["cmake", "-S", str(src), "-B", str(bdir)], ["cmake", "--build", str(bdir)]):
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
    nm = subprocess.run(["nm", "-D", "--defined-only", str(bdir / so.name)],
                        capture_output=True, text=True).stdout
    assert [line.split()[-1] for line in nm.splitlines()] == ["tc_backend_table"], nm

    out = make("check")  # the demo, with the variable naming this directory
    assert "Rank 0: backend loopback version 1.0.0, 1 rank(s)" in out
    assert "all_reduce PREMUL_SUM(2): 2.0 4.0 6.0 8.0" in out

    make("install")  # beside the installed libtorchcomms: no variable needed
    assert (libdir / "libtorchcomms-loopback.so").exists()
    run_env = dict(env, TORCHCOMM_RANK="0", TORCHCOMM_SIZE="1")
    r = subprocess.run([str(src / "demo")], capture_output=True, text=True, env=run_env,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    assert "Rank 0: done" in r.stdout

    # the standalone .so from Python (its own process: the loader caches
    # the backend loaded from build/plugins by name in this one)
    code = ("import torch, torchcomms\n"
            "c = torchcomms.new_comm('loopback', 'cpu')\n"
            "t = torch.arange(4, dtype=torch.float32)\n"
            "c.all_reduce(t, torchcomms.ReduceOp.PREMUL_SUM(0.5))\n"
            "print(c.get_backend_version(), t.tolist())\n"
            "c.finalize()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(env, **{ENV_VAR: str(so)}), timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1.0.0 [0.0, 0.5, 1.0, 1.5]"


def test_gloo_alias(monkeypatch):
    """torch's c10d names reach the library's loader: "gloo" and "torchcomms"
    on CPU give the native "cpu" backend, unless TORCHCOMMS_BACKEND_LIB_PATH_GLOO
    names a gloo plugin (here the loopback example), which then wins."""
    monkeypatch.delenv("TORCHCOMMS_BACKEND_LIB_PATH_GLOO", raising=False)
    for name in ("gloo", "torchcomms"):
        c = torchcomms.new_comm(name, "cpu", name=f"alias_{name}")
        assert c.get_backend() == "cpu"
        t = torch.ones(3)
        c.all_reduce(t, ReduceOp.SUM, async_op=False)
        assert t.tolist() == [1.0, 1.0, 1.0]
        c.finalize()
    monkeypatch.setenv("TORCHCOMMS_BACKEND_LIB_PATH_GLOO",
                       str(PLUGIN_DIR / "libtorchcomms-loopback.so"))
    c = torchcomms.new_comm("gloo", "cpu", name="alias_plugin")
    assert c.get_backend() == "gloo"
    c.finalize()
    c = torchcomms.new_comm("torchcomms", "cpu", name="alias_tc")
    assert c.get_backend() == "cpu"
    c.finalize()
