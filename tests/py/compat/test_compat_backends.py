"""Issue 13, point 2: backends written in Python and installed backends.

- torchcomms.register_backend(name, cls) with a TorchCommBackend subclass doing
  real collectives among 2 and 4 ranks (workers/backends_worker.py: every
  result exact, the Python methods called in order, async work, hooks, the
  flight recorder, split, errors, finalize);
- the helpers' answers (is_backend_built, built_backends, _is_backend_registered,
  get_backend_impl, unsafe_get_backend, _load_backend), unknown names included,
  and torch's own question (torch/testing/_internal/common_distributed.py);
- the core's deadline and abort applying to a Python backend;
- discovery through the "torchcomms.backends" entry points of a package built
  and installed at test time;
- the C plugin example beside a Python registration of the same name, and the
  one rule for a name provided several ways (docs/backends.md).

Run: make build pyinstall &&
     TC_BUILD_DIR=$PWD/build .venv/bin/python -m pytest -q tests/py/compat/test_compat_backends.py
"""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import SIZES, clean_env

ROOT = Path(__file__).resolve().parents[3]
BUILD = Path(os.environ.get("TC_BUILD_DIR", ROOT / "build")).resolve()


def run_py(code, env=None, timeout=120):
    """Runs code in a fresh interpreter (no launcher settings, no plugin
    paths unless env gives them); asserts it printed OK."""
    e = {k: v for k, v in clean_env(env).items()
         if not k.startswith("TORCHCOMMS_BACKEND_LIB_PATH_") or k in (env or {})}
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, env=e, timeout=timeout)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("OK"), \
        f"exit {r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-5000:]}"
    return r.stdout


# ---- a Python backend among ranks ----

@pytest.mark.parametrize("n", SIZES)
def test_python_backend_create(n, compat):
    compat.part("backends", n, "create")


@pytest.mark.parametrize("n", SIZES)
def test_python_backend_collectives(n, compat):
    assert compat.part("backends", n, "collectives")["ops"] == 19


@pytest.mark.parametrize("n", SIZES)
def test_python_backend_async_hooks_flight_recorder(n, compat):
    compat.part("backends", n, "async_hooks_fr")


@pytest.mark.parametrize("n", SIZES)
def test_python_backend_split(n, compat):
    compat.part("backends", n, "split")


@pytest.mark.parametrize("n", SIZES)
def test_python_backend_errors(n, compat):
    compat.part("backends", n, "errors")


@pytest.mark.parametrize("n", SIZES)
def test_python_backend_finalize_and_exit(n, compat):
    compat.part("backends", n, "finalize")
    compat.exit_ok("backends", n)


# ---- one process: the helpers' answers ----

SOLO = """
    import torch, torchcomms
    from torchcomms import TorchCommBackend, ReduceOp

    class Solo(TorchCommBackend):
        def init(self, device, name, options):
            self.name, self.options = name, options
        def finalize(self):
            self.finalized = True
        def get_rank(self):
            return 0
        def get_size(self):
            return 1
        def get_backend_name(self):
            return "solo"
        def get_comm_name(self):
            return self.name
        def all_reduce(self, tensor, op, async_op):
            tensor.add_(100)
"""


def test_helpers_answers():
    run_py(SOLO + """
    import warnings
    from torchcomms._comms import _NativeBackend

    def raises(exc, text, fn, *a):
        try:
            fn(*a)
        except exc as e:
            assert str(e) == text, (str(e), text)
            return e
        raise AssertionError(f"{fn} did not raise {exc.__name__}")

    built = {n: torchcomms.is_backend_built(n) for n in
             ("cpu", "gloo", "torchcomms", "nccl", "ncclx", "rccl", "xccl", "solo", "nope")}
    assert built == {"cpu": True, "gloo": True, "torchcomms": True, "nccl": True,
                     "ncclx": False, "rccl": False, "xccl": False, "solo": False,
                     "nope": False}, built
    assert torchcomms.is_backend_built(5) is False
    # the mpi plugin sits beside the extension where pip install found an
    # MPI compiler wrapper (setup.py); then it is built, and listed
    import os
    has_mpi = os.path.exists(os.path.join(os.path.dirname(torchcomms.__file__),
                                          "libtorchcomms-mpi.so"))
    assert torchcomms.is_backend_built("mpi") is has_mpi
    assert torchcomms.built_backends() == sorted(["cpu", "gloo", "nccl", "torchcomms"] +
                                                 ["mpi"] * has_mpi), \\
        torchcomms.built_backends()
    # torch's own question, as torch/testing/_internal/common_distributed.py asks it
    flags = {}
    for _backend, _flag in [("gloo", "TORCHCOMM_HAS_GLOO"), ("xccl", "TORCHCOMM_HAS_XCCL"),
                            ("nccl", "TORCHCOMM_HAS_NCCL"), ("rcclx", "TORCHCOMM_HAS_RCCLX"),
                            ("ncclx", "TORCHCOMM_HAS_NCCLX")]:
        if torchcomms.is_backend_built(_backend):
            flags[_flag] = True
    assert flags == {"TORCHCOMM_HAS_GLOO": True, "TORCHCOMM_HAS_NCCL": True}, flags
    # and new_comm does make what is_backend_built promises on CPU
    for name in ("cpu", "gloo", "torchcomms"):
        c = torchcomms.new_comm(name, "cpu", name="b-" + name)
        assert c.get_backend() == "cpu", c.get_backend()
        c.finalize()

    # registration
    assert torchcomms._is_backend_registered("solo") is False
    assert torchcomms._is_backend_registered is torchcomms._comms._is_backend_registered
    assert torchcomms.register_backend("solo", Solo) is None
    assert torchcomms._is_backend_registered("solo") is True
    assert torchcomms.is_backend_built("solo") is False  # registered is not built
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torchcomms.register_backend("solo", Solo)  # the same class again: nothing
    class Other(Solo):
        pass
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        torchcomms.register_backend("solo", Other)
    assert [w.category for w in ws] == [RuntimeWarning], ws
    assert str(ws[0].message) == (
        f"register_backend: backend 'solo' is already registered with {Solo!r}; the "
        f"first registration stays (as in torchcomms) and {Other!r} is ignored"), ws[0].message
    raises(TypeError, "register_backend: argument 'name' must be a str, not int",
           torchcomms.register_backend, 5, Solo)
    raises(TypeError, "register_backend: argument 'backend_class' must be a subclass of "
           "torchcomms.TorchCommBackend (the class, not an instance), not <class 'object'>",
           torchcomms.register_backend, "x", object)
    e = raises(ValueError, "torchcomms: tc_backend_register: backend name 'Bad Name' is "
               "invalid (lower-case letters, digits, '_' and '-', at most 47 characters)",
               torchcomms.register_backend, "Bad Name", Solo)
    assert torchcomms._is_backend_registered("Bad Name") is False

    c = torchcomms.new_comm("solo", torch.device("cpu"), name="s")
    impl = c.get_backend_impl()
    assert type(impl) is Solo and impl.name == "s", impl
    t = torch.ones(2)
    c.all_reduce(t, ReduceOp.SUM, async_op=False)
    assert t.tolist() == [101.0, 101.0], t
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        assert c.unsafe_get_backend() is impl
    assert [(w.category, str(w.message)) for w in ws] == [
        (DeprecationWarning, "unsafe_get_backend() is deprecated, use get_backend_impl() instead.")]
    raises(RuntimeError, 'Tried to call pure virtual function "TorchCommBackend::broadcast"',
           c.broadcast, t, 0)
    c.finalize()
    assert impl.finalized is True

    # a C backend's get_backend_impl
    c = torchcomms.new_comm("cpu", "cpu", name="native")
    n = c.get_backend_impl()
    assert isinstance(n, TorchCommBackend) and type(n) is _NativeBackend, n
    assert (n.get_backend_name(), n.get_comm_name(), n.get_rank(), n.get_size()) == \\
        ("cpu", "native", 0, 1)
    assert n.get_backend_version() == c.get_backend_version()
    assert c.get_backend_impl() is n
    raises(RuntimeError, 'Tried to call pure virtual function "TorchCommBackend::all_reduce"',
           TorchCommBackend().all_reduce, t, ReduceOp.SUM, False)
    c.finalize()

    # unknown names: torchcomms' exception and text (ours adds what was tried)
    e = raises(ModuleNotFoundError,
               "failed to find backend nope, is it registered via entry_points.txt?",
               torchcomms._load_backend, "nope")
    try:
        torchcomms.new_comm("nope", "cpu")
    except ModuleNotFoundError as e:
        assert isinstance(e, RuntimeError)
        s = str(e)
        assert s.startswith("torchcomms: backend 'nope' not found: tried "
                            "$TORCHCOMMS_BACKEND_LIB_PATH_NOPE (unset), "), s
        assert s.endswith("(failed to find backend nope, is it registered via "
                          "entry_points.txt?)"), s
    else:
        raise AssertionError("new_comm('nope') did not raise")
    print("OK")
    """)


def test_deadline_and_abort_apply():
    """The core's deadline fails a Python operation that does not return, and
    abort fails queued ones at once; the backend's thread finishes later."""
    run_py(SOLO + """
    import threading, time
    from datetime import timedelta
    release = threading.Event()

    class Hang(Solo):
        def barrier(self, async_op):
            release.wait(60)

    torchcomms.register_backend("hang", Hang)
    c = torchcomms.new_comm("hang", "cpu", name="h", timeout=timedelta(seconds=0.5))
    t0 = time.monotonic()
    try:
        c.barrier(async_op=False)
    except RuntimeError as e:
        assert str(e) == (
            "torchcomms: barrier on 'h' (rank 0 of 1): the Python backend did not return "
            "within the timeout of 0.5 s (its call goes on; later operations wait behind "
            "it: abort the communicator)"), e
    else:
        raise AssertionError("no timeout")
    assert 0.5 <= time.monotonic() - t0 < 3, time.monotonic() - t0
    fr = __import__("json").loads(c._fr_dump_json())["entries"]
    assert [(e["profiling_name"].split(":")[-1], e["state"]) for e in fr] == \
        [("barrier", "timed_out")], fr
    c.abort()
    release.set()

    release.clear()
    c = torchcomms.new_comm("hang", "cpu", name="h2")
    w1 = c.barrier(async_op=True)
    t = torch.ones(1)
    w2 = c.all_reduce(t, ReduceOp.SUM, async_op=True)  # queued behind the barrier
    t0 = time.monotonic()
    c.abort()
    for w in (w1, w2):
        try:
            w.wait()
        except RuntimeError as e:
            assert "the communicator was aborted" in str(e), e
        else:
            raise AssertionError("wait after abort did not raise")
    assert time.monotonic() - t0 < 5
    assert t.tolist() == [1.0], t  # never ran
    release.set()
    del c, w1, w2
    print("OK")
    """)


# ---- installed backends: the "torchcomms.backends" entry points ----

PACKAGE = {
    "pyproject.toml": """
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "tinyback"
        version = "0.1"

        [project.entry-points."torchcomms.backends"]
        tinyclass = "tinyback:Tiny"
        tinymod = "tinyback.registering"
        tinyexplicit = "tinyback.explicit_target:Tiny"

        [tool.setuptools]
        packages = ["tinyback"]
        """,
    "tinyback/__init__.py": """
        from torchcomms import TorchCommBackend

        class Tiny(TorchCommBackend):
            def init(self, device, name, options):
                self.name = name
            def finalize(self):
                pass
            def get_rank(self):
                return 0
            def get_size(self):
                return 1
            def get_backend_name(self):
                return "tiny"
            def get_comm_name(self):
                return self.name
            def all_reduce(self, tensor, op, async_op):
                tensor.mul_(3)
        """,
    "tinyback/registering.py": """
        import torchcomms
        from tinyback import Tiny

        class Registered(Tiny):
            def all_reduce(self, tensor, op, async_op):
                tensor.add_(7)

        torchcomms.register_backend("tinymod", Registered)
        """,
    "tinyback/explicit_target.py": """
        from tinyback import Tiny
        """,
}


@pytest.fixture(scope="module")
def tinyback(tmp_path_factory):
    src = tmp_path_factory.mktemp("tinyback-src")
    for name, text in PACKAGE.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(textwrap.dedent(text))
    site = tmp_path_factory.mktemp("tinyback-site")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation",
                        "--no-deps", "--no-index", "--quiet", "--target", str(site), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert list(site.glob("tinyback-0.1.dist-info/entry_points.txt")), list(site.iterdir())
    return site


def test_entry_point_discovery(tinyback):
    run_py(SOLO + """
    import sys
    assert torchcomms.is_backend_built("tinyclass") and torchcomms.is_backend_built("tinymod")
    import os
    has_mpi = os.path.exists(os.path.join(os.path.dirname(torchcomms.__file__),
                                          "libtorchcomms-mpi.so"))  # setup.py, with mpicc
    assert torchcomms.built_backends() == sorted(
        ["cpu", "gloo", "nccl", "tinyclass", "tinyexplicit", "tinymod", "torchcomms"] +
        ["mpi"] * has_mpi), torchcomms.built_backends()
    assert "tinyback" not in sys.modules  # asking imports nothing
    assert not torchcomms._is_backend_registered("tinyclass")

    # the entry point names a class: new_comm loads and registers it
    c = torchcomms.new_comm("tinyclass", "cpu", name="ep")
    assert type(c.get_backend_impl()).__qualname__ == "Tiny", c.get_backend_impl()
    assert torchcomms._is_backend_registered("tinyclass")
    t = torch.ones(2)
    c.all_reduce(t, ReduceOp.SUM, async_op=False)
    assert t.tolist() == [3.0, 3.0], t
    assert c.get_backend() == "tinyclass"
    c.finalize()

    # the entry point names a module that registers on import (torchcomms' way)
    c = torchcomms.new_comm("tinymod", "cpu", name="mod")
    assert type(c.get_backend_impl()).__qualname__ == "Registered"
    t = torch.ones(2)
    c.all_reduce(t, ReduceOp.SUM, async_op=False)
    assert t.tolist() == [8.0, 8.0], t
    c.finalize()
    torchcomms._load_backend("tinyclass")  # loading again is harmless

    # an explicit registration wins over the entry point (never loaded)
    torchcomms.register_backend("tinyexplicit", Solo)
    c = torchcomms.new_comm("tinyexplicit", "cpu", name="ex")
    assert type(c.get_backend_impl()) is Solo
    assert "tinyback.explicit_target" not in sys.modules
    c.finalize()
    print("OK")
    """, env={"PYTHONPATH": str(tinyback)})


# ---- a name provided both ways ----

def test_c_plugin_and_python_registration_of_one_name():
    """The loopback C plugin works by name; a Python registration of the same
    name wins from then on (also over the plugin already loaded, and over the
    c10d alias "gloo"), and the communicator made earlier keeps its plugin."""
    assert (BUILD / "plugins" / "libtorchcomms-loopback.so").exists(), "run make build"
    run_py(SOLO + """
    from torchcomms._comms import _NativeBackend
    assert torchcomms.is_backend_built("loopback")
    assert "loopback" in torchcomms.built_backends()
    c = torchcomms.new_comm("loopback", "cpu", name="lb")
    impl = c.get_backend_impl()
    assert type(impl) is _NativeBackend and impl.get_backend_name() == "loopback", impl
    t = torch.arange(4, dtype=torch.float32)
    c.all_reduce(t, ReduceOp.SUM, async_op=False)
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0], t  # one rank: the plugin's sum is the input

    torchcomms.register_backend("loopback", Solo)
    p = torchcomms.new_comm("loopback", "cpu", name="lb-py")
    assert type(p.get_backend_impl()) is Solo
    t = torch.zeros(2)
    p.all_reduce(t, ReduceOp.SUM, async_op=False)
    assert t.tolist() == [100.0, 100.0], t
    t = torch.ones(2)
    c.all_reduce(t, ReduceOp.SUM, async_op=False)  # the earlier one: still the plugin
    assert t.tolist() == [1.0, 1.0], t
    assert type(c.get_backend_impl()) is _NativeBackend

    g = torchcomms.new_comm("gloo", "cpu", name="g1")
    assert g.get_backend() == "cpu"  # c10d's name, served by the built-in
    torchcomms.register_backend("gloo", Solo)
    g2 = torchcomms.new_comm("gloo", "cpu", name="g2")
    assert g2.get_backend() == "gloo" and type(g2.get_backend_impl()) is Solo
    for x in (c, p, g, g2):
        x.finalize()
    print("OK")
    """, env={"TORCHCOMMS_BACKEND_LIB_PATH_LOOPBACK": str(BUILD / "plugins")})
