"""torchcomms.device_mesh's process-group helpers with upstream's signatures:
_create_torchcomm_process_group and _flatten_with_comm (a 2-D mesh at 4
ranks, 1-D at 2). Parts of the c10d launch (workers/c10d_worker.py).

Run: TC_BUILD_DIR=$PWD/build .venv/bin/python -m pytest -q tests/py/compat/test_compat_device_mesh.py
"""

import pytest

from conftest import SIZES


@pytest.mark.parametrize("n", SIZES)
def test_create_torchcomm_process_group(n, compat):
    compat.part("c10d", n, "mesh_create_pg")


@pytest.mark.parametrize("n", SIZES)
def test_flatten_with_comm(n, compat):
    compat.part("c10d", n, "mesh_flatten")
