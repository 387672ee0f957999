"""The c10d wrapper's corners (issue 13, point 3): torchcomms._comms._BackendWrapper
where torch and torchcomms' tests import it, coalescing (batch_isend_irecv
with recvs listed first), all_gather into aliased outputs, monitored_barrier,
shutdown/abort. One torchrun launch of workers/c10d_worker.py per world size
(2 and 4); each test reads its part (see the worker's docstring).

Run: TC_BUILD_DIR=$PWD/build .venv/bin/python -m pytest -q tests/py/compat/test_compat_c10d.py
"""

import os
import subprocess
import sys

import pytest

from conftest import SIZES, clean_env

AREA = "c10d"


@pytest.mark.parametrize("n", SIZES)
def test_backend_wrapper_import_paths(n, compat):
    compat.part(AREA, n, "import_paths")


@pytest.mark.parametrize("first", [
    "from torchcomms._comms import _BackendWrapper",
    "import torchcomms._backend_wrapper",
    "import torchcomms; torchcomms.register_c10d_backend()",
    "import torch",
])
def test_backend_wrapper_import_orders(first):
    """Whatever is imported first, torch.distributed ends up with our
    _BackendWrapper (torch imports it while torch itself imports)."""
    code = (f"{first}\n"
            "import torch.distributed.distributed_c10d as c10d\n"
            "from torchcomms._comms import _BackendWrapper\n"
            "import torchcomms._backend_wrapper as bw\n"
            "assert _BackendWrapper is bw._BackendWrapper\n"
            "assert c10d._TORCHCOMM_AVAILABLE, 'torch did not find torchcomms'\n"
            "assert c10d._BackendWrapper is _BackendWrapper\n"
            "print('ok')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=clean_env(), timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-3000:]


def test_backend_wrapper_name_stays_lazy():
    """import torchcomms and `from torchcomms._comms import *` stay torch-free;
    the name loads torch only when asked for."""
    code = ("import sys, torchcomms\n"
            "from torchcomms._comms import *\n"
            "assert 'torch' not in sys.modules\n"
            "import torchcomms._comms as m\n"
            "cls = m._BackendWrapper\n"
            "assert 'torch' in sys.modules and cls.__name__ == '_BackendWrapper'\n"
            "print('ok')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=clean_env(), timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-3000:]


@pytest.mark.parametrize("n", SIZES)
def test_coalescing_batch_isend_irecv(n, compat):
    compat.part(AREA, n, "coalescing")


@pytest.mark.parametrize("n", SIZES)
def test_all_gather_aliased_outputs(n, compat):
    compat.part(AREA, n, "allgather_aliased")


@pytest.mark.parametrize("n", SIZES)
def test_monitored_barrier(n, compat):
    compat.part(AREA, n, "monitored_barrier")


@pytest.mark.parametrize("n", SIZES)
def test_monitored_barrier_through_dist(n, compat):
    compat.part(AREA, n, "monitored_barrier_dist")


@pytest.mark.parametrize("n", SIZES)
def test_shutdown_abort(n, compat):
    compat.part(AREA, n, "shutdown_abort")
    compat.part(AREA, n, "destroy")
    compat.part(AREA, n, "destroy_use_torchcomms")


@pytest.mark.parametrize("n", SIZES)
def test_c10d_launch_exits_cleanly(n, compat):
    secs = compat.exit_ok(AREA, n)
    assert secs < 120, f"the c10d launch took {secs:.0f} s"
