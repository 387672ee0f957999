"""torchcomms.functional (issue 13, point 1): TorchComm collectives as torch
custom operators for torch.compile and autograd, at 2 and 4 ranks.

The worker (workers/functional_worker.py) runs every part on every rank; the
tensor-parallel MLP is compiled with the default inductor backend at 2 ranks
and with aot_eager at 4 (inductor at 4 ranks compiles on 2 cores for about a
minute: FUNCTIONAL_TP_BACKEND=inductor runs it there too).

Run: TC_BUILD_DIR=$PWD/build .venv/bin/python -m pytest -q tests/py/compat/test_compat_functional.py
"""

import os
import subprocess
import sys

import pytest

from conftest import SIZES, clean_env

AREA = "functional"


def _env(n):
    backend = os.environ.get("FUNCTIONAL_TP_BACKEND") or ("inductor" if n == 2 else "aot_eager")
    return {"FUNCTIONAL_TP_BACKEND": backend}


def part(compat, n, name):
    return compat.part(AREA, n, name, env=_env(n), timeout=600)


@pytest.mark.parametrize("n", SIZES)
def test_ops_registered(n, compat):
    part(compat, n, "ops_registered")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("mode", ["functional", "inplace", "method"])
def test_every_collective_eager(n, mode, compat):
    part(compat, n, f"{mode}_eager")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("mode", ["functional", "inplace", "method"])
def test_every_collective_compiled_fullgraph(n, mode, compat):
    part(compat, n, f"{mode}_compiled")


@pytest.mark.parametrize("n", SIZES)
def test_async_tensor_and_wait(n, compat):
    part(compat, n, "async_wait")


@pytest.mark.parametrize("n", SIZES)
def test_autograd_formulas_eager(n, compat):
    part(compat, n, "autograd_eager")


@pytest.mark.parametrize("n", SIZES)
def test_autograd_formulas_compiled(n, compat):
    part(compat, n, "autograd_compiled")


@pytest.mark.parametrize("n", SIZES)
def test_errors(n, compat):
    part(compat, n, "errors")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("variant", ["tp_mlp_allreduce", "tp_mlp_sequence_parallel"])
def test_tensor_parallel_mlp_matches_reference(n, variant, compat):
    fig = part(compat, n, variant)
    print(f"\n{variant} at {n} ranks ({fig[variant + '_backend']}): max |diff| "
          f"{fig[variant + '_max_abs_diff']:.3g}, compile + first step "
          f"{fig[variant + '_compile_and_first_step_s']} s")
    assert fig[variant + "_max_abs_diff"] <= 1e-6
    assert fig[variant + "_backend"] == _env(n)["FUNCTIONAL_TP_BACKEND"]


@pytest.mark.parametrize("n", SIZES)
def test_exit_clean(n, compat):
    compat.exit_ok(AREA, n, env=_env(n), timeout=600)


def test_import_torchcomms_stays_torch_free():
    """`import torchcomms` loads no torch; `import torchcomms.functional`
    (or the attribute) does, and defines the operators."""
    code = (
        "import sys, torchcomms\n"
        "assert 'torch' not in sys.modules, 'import torchcomms loaded torch'\n"
        "assert 'torchcomms.functional' not in sys.modules\n"
        "assert 'functional' in dir(torchcomms)\n"
        "F = torchcomms.functional\n"
        "assert 'torch' in sys.modules and 'torchcomms.functional' in sys.modules\n"
        "import torch\n"
        "assert F is sys.modules['torchcomms.functional']\n"
        "assert hasattr(torch.ops.torchcomms, 'torchcomm_all_reduce_')\n"
        "import torchcomms.functional as G\n"
        "assert G is F\n"
        "print('ok')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=clean_env(), timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr
