"""float8_e4m3fn and float8_e5m2 tensors (torch.float8_e4m3fn /
torch.float8_e5m2) through TorchComm.

1. World size 1, in this process: every operation takes the float8 types;
   PREMUL_SUM and AVG round like torch (float32, then torch's conversion);
   bitwise reductions are refused and messages name the float8 dtypes.
2. Two ranks under torchrun (tests/py/workers/fp8_worker.py): all_reduce
   with every reduction, reduce_scatter_single, broadcast and all_gather,
   every pair of values of each format and 1 Mi + 3 random elements,
   compared exactly with torch computing the same in float32 -- on the cpu
   backend, and on the nccl backend over the fake NCCL (tests/c/fake_nccl/,
   which reports NCCL 2.27: ncclFloat8e4m3 / ncclFloat8e5m2 exist from 2.24),
   where AVG and PREMUL_SUM are refused (NCCL has neither on float8).

Run: TC_BUILD_DIR=build .venv/bin/python -m pytest -q tests/py/test_fp8_py.py
"""

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
torchcomms = pytest.importorskip("torchcomms")
pytest.importorskip("torchcomms._comms")
from torchcomms import ReduceOp  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("TC_BUILD_DIR", ROOT / "build"))
FAKE = BUILD / "fake_nccl"
WORKER = ROOT / "tests" / "py" / "workers" / "fp8_worker.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
              "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
              "TORCHELASTIC_RUN_ID", "TORCHCOMM_RANK", "TORCHCOMM_SIZE",
              "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
              "SLURM_PROCID", "SLURM_NTASKS", "TORCHCOMMS_NCCL_FAKE_HOST",
              "TORCHCOMMS_BACKEND_LIB_PATH_NCCL")
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def every_byte(dt):
    return torch.arange(256, dtype=torch.int64).to(torch.uint8).view(dt)


def same(got, want):
    """Equal bytes, or both NaN."""
    g, w = got.view(torch.uint8), want.view(torch.uint8)
    return bool(((g == w) | (got.float().isnan() & want.float().isnan())).all())


@pytest.fixture(scope="module")
def comm():
    with pytest.MonkeyPatch.context() as mp:
        for k in LAUNCH_ENV:
            mp.delenv(k, raising=False)
        c = torchcomms.new_comm("cpu", torch.device("cpu"), name="fp8",
                                timeout=timedelta(seconds=30))
    assert c.get_size() == 1
    yield c
    c.finalize()


@pytest.mark.parametrize("dt", FP8, ids=str)
def test_world1_every_op_moves_the_bytes(comm, dt):
    x = every_byte(dt)
    for op in (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX):
        t = x.clone()
        comm.all_reduce(t, op, async_op=False)
        assert torch.equal(t.view(torch.uint8), x.view(torch.uint8)), op
        t = x.clone()
        comm.reduce(t, 0, op, async_op=False)
        assert torch.equal(t.view(torch.uint8), x.view(torch.uint8)), op
    t = x.clone()
    comm.broadcast(t, 0, async_op=True).wait()
    assert torch.equal(t.view(torch.uint8), x.view(torch.uint8))
    out = torch.empty(256, dtype=dt)
    comm.all_gather_single(out, x, async_op=False)
    assert torch.equal(out.view(torch.uint8), x.view(torch.uint8))
    outs = [torch.empty(256, dtype=dt)]
    comm.all_to_all(outs, [x], async_op=False)
    assert torch.equal(outs[0].view(torch.uint8), x.view(torch.uint8))
    b = comm.batch_op_create()
    r = torch.empty(256, dtype=dt)
    b.send(x, 0)
    b.recv(r, 0)
    b.issue(False)
    assert torch.equal(r.view(torch.uint8), x.view(torch.uint8))


@pytest.mark.parametrize("dt", FP8, ids=str)
@pytest.mark.parametrize("factor", [0.5, 3.0, -0.375, 1e6, 1.0 / 3.0])
def test_world1_premul_sum_rounds_like_torch(comm, dt, factor):
    x = every_byte(dt)
    t = x.clone()
    comm.all_reduce(t, ReduceOp.PREMUL_SUM(factor), async_op=False)
    f = torch.tensor(factor, dtype=torch.float32)
    assert same(t, (x.float() * f).to(dt))
    # AVG of one rank divides by 1: NaNs become the canonical NaN, like torch
    t = x.clone()
    comm.all_reduce(t, ReduceOp.AVG, async_op=False)
    assert same(t, (x.float() / 1).to(dt))


def test_world1_saturation_and_overflow(comm):
    # e4m3fn saturates at 448 (infinities included), e5m2 overflows to Inf:
    # the same as torch's conversions
    big = torch.tensor([448.0, -448.0, 57344.0])
    for dt in FP8:
        t = big.to(dt)
        comm.all_reduce(t, ReduceOp.PREMUL_SUM(4.0), async_op=False)
        assert same(t, (big.to(dt).float() * 4.0).to(dt)), dt
    t = big.to(torch.float8_e4m3fn)
    comm.all_reduce(t, ReduceOp.PREMUL_SUM(4.0), async_op=False)
    assert t.view(torch.uint8).tolist() == [0x7E, 0xFE, 0x7E]
    t = big.to(torch.float8_e5m2)
    comm.all_reduce(t, ReduceOp.PREMUL_SUM(4.0), async_op=False)
    assert t.view(torch.uint8).tolist() == [0x67, 0xE7, 0x7C]  # 1792, -1792, Inf


@pytest.mark.parametrize("dt", FP8, ids=str)
def test_world1_refusals_name_the_dtype(comm, dt):
    name = str(dt).replace("torch.", "")
    x = torch.zeros(4, dtype=dt)
    for op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR):
        with pytest.raises(TypeError, match=f"is not defined for dtype {name} "
                                            r"\(bitwise reductions"):
            comm.all_reduce(x, op, async_op=False)
    other = torch.float8_e5m2 if dt == torch.float8_e4m3fn else torch.float8_e4m3fn
    oname = str(other).replace("torch.", "")
    with pytest.raises(ValueError, match=f"argument 'output' has dtype {oname} but "
                                         f"argument 'input' has dtype {name}"):
        comm.all_gather_single(torch.zeros(4, dtype=other), x, async_op=False)


def run_worker(backend, env, timeout=300):
    p = subprocess.run([str(TORCHRUN), "--standalone", "--nproc_per_node=2", str(WORKER),
                        backend], env=env, capture_output=True, text=True,
                       timeout=timeout, cwd=str(ROOT))
    out = p.stdout[-8000:] + p.stderr[-8000:]
    assert p.returncode == 0, out
    for r in range(2):
        assert f"fp8 worker rank {r} of 2:" in p.stdout, out
    assert "FAIL" not in p.stdout, out


def clean_env():
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    env["OMP_NUM_THREADS"] = "1"
    return env


def test_two_ranks_cpu_exact_against_torch():
    run_worker("cpu", clean_env())


@pytest.mark.skipif(not (FAKE / "libtcfake_nccl.so").exists(),
                    reason=f"the fake NCCL is not built ({FAKE}; run make build)")
def test_two_ranks_nccl_fake_exact_against_torch():
    env = clean_env()
    env.update(TCFAKE_NCCL_TIMEOUT="60", TORCHCOMMS_NCCL_FAKE_HOST="1",
               TORCHCOMMS_NCCL_LIB=str(FAKE / "libtcfake_nccl.so"),
               TORCHCOMMS_CUDART_LIB=str(FAKE / "libtcfake_cudart.so"))
    run_worker("nccl", env)
