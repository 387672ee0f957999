"""Contract details of torchcomms' Python API on the cpu backend (issue 13,
point 4): split refusals, TorchWork.wait_blocking / _set_status, CommOptions
(name, get_options), tensor_register / tensor_deregister, get_mem_allocator,
and the names and keywords of TorchComm / TorchWork / CommOptions. The
worker (workers/contract_worker.py) runs under torchrun at 2 and 4 ranks;
docs/python_api.md ("Name by name against torchcomms") is the name table."""
import subprocess
import sys

import pytest

from conftest import SIZES, clean_env

AREA = "contract"


@pytest.mark.parametrize("n", SIZES)
def test_split_duplicate_ranks_raise_everywhere(n, compat):
    compat.part(AREA, n, "split_dup_ranks")


@pytest.mark.parametrize("n", SIZES)
def test_split_without_caller_raise_everywhere(n, compat):
    compat.part(AREA, n, "split_without_caller")


@pytest.mark.parametrize("n", SIZES)
def test_split_valid_and_none(n, compat):
    compat.part(AREA, n, "split_valid_and_none")


@pytest.mark.parametrize("n", SIZES)
def test_wait_blocking_not_implemented(n, compat):
    compat.part(AREA, n, "wait_blocking")


@pytest.mark.parametrize("n", SIZES)
def test_set_status_only_python_works(n, compat):
    compat.part(AREA, n, "set_status")


@pytest.mark.parametrize("n", SIZES)
def test_comm_options_complete(n, compat):
    compat.part(AREA, n, "comm_options")


@pytest.mark.parametrize("n", SIZES)
def test_set_hints(n, compat):
    compat.part(AREA, n, "set_hints")


@pytest.mark.parametrize("n", SIZES)
def test_tensor_register(n, compat):
    compat.part(AREA, n, "tensor_register")


@pytest.mark.parametrize("n", SIZES)
def test_mem_allocator(n, compat):
    compat.part(AREA, n, "mem_allocator")


@pytest.mark.parametrize("n", SIZES)
def test_surface(n, compat):
    compat.part(AREA, n, "surface")


@pytest.mark.parametrize("n", SIZES)
def test_exit_ok(n, compat):
    secs = compat.exit_ok(AREA, n)
    assert secs < 120, f"the contract worker took {secs:.0f} s at {n} ranks"


def test_get_mem_allocator_without_torch_import():
    """get_mem_allocator is torch-free until a tensor is made (import
    torchcomms stays torch-free)."""
    code = ("import sys, torchcomms\n"
            "a = torchcomms.get_mem_allocator('cpu')\n"
            "assert a.backend == 'cpu' and 'torch' not in sys.modules, sorted(sys.modules)\n"
            "try:\n"
            "    torchcomms.get_mem_allocator('ncclx')\n"
            "except RuntimeError as e:\n"
            "    assert 'No allocator factory registered for backend: ncclx' in str(e), e\n"
            "else:\n"
            "    raise AssertionError('no error')\n"
            "print('ok')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=clean_env(), timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr
