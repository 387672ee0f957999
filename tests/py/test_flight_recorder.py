"""The flight recorder's automatic dump, read back by torch's own analyser.

A 4-rank (and 8-rank) job under tcrun (tests/c/helpers/fr_sigstop.c): the
last rank stops itself with SIGSTOP before the fourth collective; the others
time out, each error carries the hang report naming the stopped rank, and
each rank's trace is written to TORCH_FR_DUMP_TEMP_FILE<rank> before its
error is returned. Rank 0 then continues the stopped rank, whose next
collectives fail on the lost peers, which dumps its trace too.
`python -m torch.distributed.flight_recorder.fr_trace` must read the four
files, rebuild the job's group and collectives, and point at the stopped
rank."""
import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

BUILD = Path(os.environ.get("TC_BUILD_DIR", Path(__file__).resolve().parents[2] / "build"))


def run(cmd, env_extra, timeout=120):
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
              "TORCHCOMM_TIMEOUT_SECONDS"):
        env.pop(k, None)
    env.update(env_extra)
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.parametrize("n", [4, 8])
def test_sigstopped_peer_dump_read_by_torch_analyser(tmp_path, n):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    p = run([BUILD / "tcrun", "-n", n, BUILD / "tc_fr_sigstop"],
            {"TORCH_FR_DUMP_TEMP_FILE": str(dumps / "trace_rank_")})
    assert p.returncode == 0, p.stdout + p.stderr
    last = n - 1
    # every punctual rank's error explains the hang
    for r in range(last):
        m = re.search(rf"^rank {r} error: (.*)$", p.stdout, re.M)
        assert m, p.stdout
        assert (f"torchcomms: all_reduce on 'world' (rank {r} of {n}): timed out after 2 s"
                in m.group(1))
        assert (f"[hang report: all_reduce #4: rank {last} never entered it (rank {last}'s "
                f"last completed op is all_gather_single #3)]") in m.group(1)
    # the stopped rank, continued, finds its peers gone and says so: over
    # shared memory #4 completes from what they left and #5 fails (they never
    # entered it); over TCP #4 fails (they gave up on it)
    m = re.search(rf"^rank {last} after SIGCONT: (.*)$", p.stdout, re.M)
    assert m, p.stdout
    msg = m.group(1)
    others = "ranks " + ", ".join(map(str, range(last - 1))) + f" and {last - 1}"
    assert ("closed its connection" in msg or "was reset" in msg), msg
    assert (f"[hang report: all_reduce #5: {others} never entered it" in msg
            or f"[hang report: all_reduce #4: every rank entered it; {others} failed it too"
            in msg), msg
    files = sorted(os.listdir(dumps))
    assert files == sorted(f"trace_rank_{r}" for r in range(n)), files

    # each file is torch's pickled dump
    d0 = pickle.loads((dumps / "trace_rank_0").read_bytes())
    assert d0["version"] == "2.10"
    assert d0["pg_config"]["world"]["ranks"] == "[" + ", ".join(map(str, range(n))) + "]"
    names = [e["profiling_name"] for e in d0["entries"]]
    assert names == ["gloo:all_reduce", "gloo:broadcast", "gloo:all_gather_single",
                     "gloo:all_reduce"], names
    states = [e["state"] for e in d0["entries"]]
    assert states == ["completed", "completed", "completed", "timed_out"], states
    e = d0["entries"][3]
    assert e["collective_seq_id"] == 4 and e["input_sizes"] == [[16]]
    assert e["input_dtypes"] == ["Float"] and e["timeout_ms"] == 2000
    assert e["time_discovered_completed_ns"] >= e["time_created_ns"] > 0

    # torch's analyser reads the folder and rebuilds the job
    db_path = tmp_path / "db.pkl"
    a = run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", dumps,
             "-o", db_path], {})
    assert a.returncode == 0, a.stdout + a.stderr
    _types, db = pickle.loads(db_path.read_bytes())
    assert len(db.groups) == 1 and db.groups[0].size == n
    assert sorted(m.global_rank for m in db.memberships) == list(range(n))
    by_seq = {c.collective_seq_id: c for c in db.collectives}
    for seq in (1, 2, 3):  # the collectives every rank completed match
        assert by_seq[seq].pass_check, by_seq[seq]
    # #4: the stopped rank is the culprit of the mismatch the analyser finds
    out = a.stdout + a.stderr
    assert "Collective sequence number: 4 has errors" in out, out
    assert f"Culprit rank {last}" in out, out


STACK_SCRIPT = r'''
import json, torch
from torchcomms import new_comm
from torchcomms.hooks import FlightRecorderHook

def training_step(comm, t):
    comm.all_reduce(t, async_op=False)   # line 7

comm = new_comm("cpu", torch.device("cpu"), name="stacks")
rec = FlightRecorderHook(max_entries=16)
rec.register_with_comm(comm)
training_step(comm, torch.ones(4))
print(json.dumps(json.loads(rec.dump_json())["entries"][-1]["frames"]))
comm.finalize()
'''


def test_stack_frames_on_request_name_the_python_caller(tmp_path):
    """TORCHCOMMS_FR_STACK=1: each entry's frames start with the Python
    caller (innermost first, file and line), then the C entry point."""
    script = tmp_path / "stacks.py"
    script.write_text(STACK_SCRIPT)
    p = run([sys.executable, script], {"TORCHCOMMS_FR_STACK": "1"})
    assert p.returncode == 0, p.stdout + p.stderr
    frames = json.loads(p.stdout.strip().splitlines()[-1])
    assert frames[0] == {"name": "training_step", "filename": str(script), "line": 7}, frames
    assert frames[1] == {"name": "<module>", "filename": str(script), "line": 12}, frames
    assert "tc_all_reduce" in [f["name"] for f in frames[2:]], frames
    # without the setting, no frames are kept
    p = run([sys.executable, script], {})
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip().splitlines()[-1] == "[]"
