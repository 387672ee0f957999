"""torchcomms.objcol: the six object collectives on real processes.

With 2 and 4 ranks (torchrun, this file is also the worker: run as a script
it does the rank's part) and at world size 1 in this process. Objects: None,
numbers, strings, bytes, nested containers, tensors, objects of > 1 MB, and
(with weights_only=False or TORCHCOMMS_SERIALIZATION=pickle) instances of an
arbitrary class. Objects differ in size from rank to rank, so the padding to
the largest size is exercised. Both argument orders are used: upstream
torchcomms' (root first) and torch.distributed's (dst / src last).

Run: .venv/bin/python -m pytest -q tests/py/test_objcol.py
"""

import json
import math
import os
import signal
import subprocess
import sys
import traceback
from datetime import timedelta
from pathlib import Path

LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
              "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
              "TORCHELASTIC_RUN_ID", "TORCHCOMM_RANK", "TORCHCOMM_SIZE")


class Point:
    """An arbitrary user class (not accepted by weights_only loading)."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __eq__(self, other):
        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)

    def __repr__(self):
        return f"Point({self.x}, {self.y})"


def same(a, b):
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b))
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return (type(b) is dict and a.keys() == b.keys()
                and all(same(a[k], b[k]) for k in a))
    return type(a) is type(b) and a == b


def big_bytes(seed, n):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).numpy().tobytes()


def safe_obj(r):
    """weights_only-safe objects, of a size depending on the rank."""
    import torch

    objs = [None, r, -r * 1.5, f"rank {r}", {"r": r, "l": [1, (2, 3)], "n": None},
            torch.arange(r + 1, dtype=torch.int64)]
    if r % 2 == 0:  # a large one (> 1 MB) on even ranks only
        objs.append(big_bytes(r, (1 << 20) + 12345))
        objs.append(torch.full((300_000,), float(r)))
    return objs


def any_obj(r):
    """Arbitrary picklable objects (need weights_only=False or pickle)."""
    return {"p": Point(r, -r), "s": {1, 2, r}, "t": (Point(0, r),), "big": "x" * (r * 700_000)}


def run_all(comm, weights_only, make, tag, errors):
    """Every function once per root; `make(r)` gives rank r's object."""
    from torchcomms import objcol

    rank, size = comm.get_rank(), comm.get_size()
    kw = {"weights_only": weights_only}

    def check(what, got, exp):
        if not same(got, exp):
            errors.append(f"[{tag}] {what}: got {str(got)[:300]} expected {str(exp)[:300]}")

    out = [None] * size
    objcol.all_gather_object(comm, out, make(rank), **kw)
    check("all_gather_object", out, [make(r) for r in range(size)])
    objcol.all_gather_object(comm, out, None, timeout=timedelta(seconds=30), **kw)
    check("all_gather_object None", out, [None] * size)

    for root in range(size):
        # upstream order: (comm, obj, root, object_gather_list)
        out = [None] * size if rank == root else None
        objcol.gather_object(comm, make(rank), root, out, **kw)
        if rank == root:
            check(f"gather_object root={root}", out, [make(r) for r in range(size)])
        # torch.distributed order: (comm, obj, object_gather_list, dst)
        out = [None] * size if rank == root else None
        objcol.gather_object(comm, make(rank) if rank else None, out, root, **kw)
        if rank == root:
            check(f"gather_object dist-order dst={root}", out,
                  [None] + [make(r) for r in range(1, size)])

        objs = make(root) if isinstance(make(root), list) else [make(root), None, "tail"]
        lst = list(objs) if rank == root else [None] * len(objs)
        objcol.broadcast_object_list(comm, lst, root, **kw)
        check(f"broadcast_object_list root={root}", lst, objs)
        lst = list(objs) if rank == root else ["junk"] * len(objs)
        objcol.broadcast_object_list(comm, lst, src=root, **kw)
        check(f"broadcast_object_list src={root}", lst, objs)

        out = [None]
        inputs = [make(r) for r in range(size)] if rank == root else None
        objcol.scatter_object_list(comm, root, out, inputs, **kw)
        check(f"scatter_object_list root={root}", out[0], make(rank))
        out = ["junk", "kept"]
        objcol.scatter_object_list(comm, out, inputs, root, **kw)  # torch.distributed order
        check(f"scatter_object_list dist-order src={root}", out, [make(rank), "kept"])

    if size > 1:
        for k in range(1, size):
            dst, src = (rank + k) % size, (rank - k) % size
            msg = [make(rank), None, k]
            got = [None] * 3
            # r -> r + k is a union of cycles; ranks 0..gcd-1 (one per cycle)
            # send first, the others receive first: no cycle of blocking sends
            if rank < math.gcd(size, k):
                objcol.send_object_list(comm, msg, dst)
                objcol.recv_object_list(comm, got, src, **kw)
            else:
                objcol.recv_object_list(comm, got, src, **kw)
                objcol.send_object_list(comm, msg, dst=dst)
            check(f"send/recv_object_list +{k}", got, [make(src), None, k])

    objcol.broadcast_object_list(comm, [], 0, **kw)  # nothing to do, but no error


def rank_main(outdir):
    import torch
    from torchcomms import new_comm

    comm = new_comm("cpu", torch.device("cpu"), name="objcol", timeout=timedelta(seconds=60))
    errors = []
    for tag, fn in [
        ("safe", lambda: run_all(comm, True, safe_obj, "safe", errors)),
        ("arbitrary, weights_only=False", lambda: run_all(comm, False, any_obj, "any", errors)),
        ("pickle serialization", lambda: pickle_mode(comm, errors)),
        ("weights_only rejects", lambda: rejects(comm, errors)),
    ]:
        try:
            fn()
        except Exception:
            errors.append(f"[{tag}] raised:\n{traceback.format_exc()}")
            break  # the ranks may be out of step now
    try:
        if errors:
            comm.abort()  # the ranks may be out of step: finalize could hang
        comm.finalize()
    except Exception:
        errors.append(f"[finalize] raised:\n{traceback.format_exc()}")
    with open(os.path.join(outdir, f"rank{comm.get_rank()}.json"), "w") as f:
        json.dump({"rank": comm.get_rank(), "errors": errors}, f)
    return 1 if errors else 0


def pickle_mode(comm, errors):
    os.environ["TORCHCOMMS_SERIALIZATION"] = "pickle"
    try:
        run_all(comm, True, any_obj, "pickle", errors)
    finally:
        del os.environ["TORCHCOMMS_SERIALIZATION"]


def rejects(comm, errors):
    """Default serializer + weights_only=True refuses arbitrary classes (as
    upstream), on every rank, without leaving the ranks out of step."""
    from torchcomms import objcol

    out = [None] * comm.get_size()
    try:
        objcol.all_gather_object(comm, out, Point(1, 2))
    except Exception as e:  # noqa: BLE001  (torch's UnpicklingError)
        if "weights" not in str(e).lower():
            errors.append(f"[rejects] unexpected error {type(e).__name__}: {e}")
    else:
        errors.append("[rejects] Point was accepted with weights_only=True")
    objcol.all_gather_object(comm, out, comm.get_rank())
    if out != list(range(comm.get_size())):
        errors.append(f"[rejects] next call: {out}")


if __name__ == "__main__":
    sys.exit(rank_main(sys.argv[1]))


# --------------------------------------------------------------------------
# pytest side
# --------------------------------------------------------------------------

import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("torchcomms._comms")
TORCHRUN = Path(sys.executable).with_name("torchrun")


def clean_env():
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    env["OMP_NUM_THREADS"] = "1"
    env.pop("TORCHCOMMS_SERIALIZATION", None)
    return env


def launch(cmd, env, timeout):
    """Runs a launcher (torchrun / tcrun) in its own process group; on timeout
    the whole group (launcher and ranks) is killed and returncode is None."""
    p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return subprocess.CompletedProcess(p.args, None, out, err + f"\n*** TIMEOUT after {timeout} s")
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


@pytest.mark.parametrize("n", [2, 4])
def test_objcol_ranks(n, tmp_path):
    p = launch([TORCHRUN, "--standalone", f"--nproc_per_node={n}", __file__, tmp_path],
               clean_env(), 240)
    log = f"exit {p.returncode}\n{p.stdout[-4000:]}\n{p.stderr[-6000:]}"
    errors = []
    for r in range(n):
        f = tmp_path / f"rank{r}.json"
        assert f.exists(), f"rank {r} wrote no result\n{log}"
        errors += [f"rank {r}: {e}" for e in json.loads(f.read_text())["errors"]]
    assert not errors, "\n".join(errors[:20])
    assert p.returncode == 0, log


@pytest.fixture
def comm1():
    with pytest.MonkeyPatch.context() as mp:
        for k in LAUNCH_ENV:
            mp.delenv(k, raising=False)
        mp.delenv("TORCHCOMMS_SERIALIZATION", raising=False)
        from torchcomms import new_comm

        c = new_comm("cpu", "cpu", name="objcol1", timeout=timedelta(seconds=30))
        yield c
        c.finalize()


def test_objcol_world_size_1(comm1):
    errors = []
    run_all(comm1, True, safe_obj, "ws1 safe", errors)
    run_all(comm1, False, any_obj, "ws1 any", errors)
    assert not errors, "\n".join(errors)


def test_objcol_argument_errors(comm1):
    from torchcomms import objcol

    with pytest.raises(ValueError):
        objcol.scatter_object_list(comm1, 0, [], [1])
    with pytest.raises(ValueError):
        objcol.scatter_object_list(comm1, 0, [None], None)
    with pytest.raises(ValueError):
        objcol.scatter_object_list(comm1, 0, [None], [1, 2])
    with pytest.raises(ValueError):
        objcol.gather_object(comm1, 1, 0, None)
    with pytest.raises(TypeError):
        objcol.broadcast_object_list(comm1, [1])  # no root


def test_objcol_imports_no_torch_distributed():
    code = ("import sys, torchcomms.objcol; "
            "print('torch.distributed' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=clean_env(), timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False"
