"""make test runs tests/py twice: over shared memory, then with the cpu
backend forced onto TCP (TORCHCOMMS_CPU_TRANSPORT=tcp). The second pass is
for what the transport changes; the modules below test layers above it and
run in the shared-memory pass only (each line says why). Collectives,
point-to-point, failures, DDP/FSDP, c10d and fault-tolerance recovery run in
both; of the examples the TCP pass launches one of each kind
(test_examples_py.py, TCP_RUNS). tests/py/compat/conftest.py does the same
for the compatibility areas."""
import os
from pathlib import Path

import pytest

SHM_PASS_ONLY = {
    "test_check_layers.py": "the include graph",
    "test_op_list.py": "the operation list and the stub",
    "test_import_safety.py": "what importing torchcomms does (gloo runs on gloo)",
    "test_store_variants.py": "stores (no transport under them)",
    "test_store_interop.py": "stores (no transport under them)",
    "test_nccl_fake.py": "the nccl backend (the cpu transport is not used)",
    "test_nccl_fake_windows.py": "the nccl backend's windows (the cpu transport is not used)",
    "test_plugin_example.py": "a plugin backend (the cpu transport is not used)",
    "test_fp8_py.py": "fp8 conversions and reduction kernels",
    "test_hooks_py.py": "hooks, called by the core around every backend",
    "test_objcol.py": "object collectives' pickling over the collectives",
    "test_handles_rss.py": "the handle tables' memory",
    "test_soak.py": "the soak driver (make soak runs it on both)",
    "test_perf.py": "tcperf's command line and output (make bench measures)",
    "test_bench_targets.py": "make bench's target lines from made-up CSVs (no transport)",
    "test_threads_one_process.py": "chooses shared memory and TCP itself",
    "test_torchft.py": "torchft over the API (recovery on TCP: test_reconfigure.py)",
}


def pytest_collection_modifyitems(config, items):
    if os.environ.get("TORCHCOMMS_CPU_TRANSPORT") != "tcp":
        return
    for item in items:
        why = SHM_PASS_ONLY.get(Path(str(item.fspath)).name)
        if why:
            item.add_marker(pytest.mark.skip(
                reason=f"shared-memory pass only (tests/py/conftest.py): {why}"))
