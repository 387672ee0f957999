#!/usr/bin/env python3
"""make test-mpi, kind 'abort': abort_process_on_timeout_or_error under
mpirun. Rank 0 receives from rank 1 with a 1 s timeout on a communicator
that aborts the process on error; rank 1 never sends and waits (60 s) for a
message that never comes. The expected end: rank 0's timeout is printed,
the backend ends the job with MPI_Abort, and the launcher stops rank 1 at
once (run.sh checks the output and that it took far less than 60 s)."""
import sys
from datetime import timedelta

import torch
import torchcomms

backend = sys.argv[1] if len(sys.argv) > 1 else "mpi"
comm = torchcomms.new_comm(backend, torch.device("cpu"), name="abortjob",
                           abort_process_on_timeout_or_error=True)
rank = comm.get_rank()
t = torch.zeros(4)
print(f"abort_job: rank {rank} ready", flush=True)
if rank == 0:
    comm.recv(t, 1, async_op=False, timeout=timedelta(seconds=1))
    print("abort_job: FAIL: the receive returned", flush=True)
    sys.exit(1)
elif rank == 1:
    comm.recv(t, 0, async_op=False, timeout=timedelta(seconds=60))
    print("abort_job: FAIL: rank 1's receive returned", flush=True)
    sys.exit(1)
