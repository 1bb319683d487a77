"""What the test workers (real torch gloo jobs) share: appending a JSON line to a record file,
leaving the process group, and ending the process. A worker finds this module through
sys.path, relative to its own __file__ (it may run under ddprun, torchrun, ssh or a network
namespace, with whatever environment the test gave it):

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "lib" / "workers"))
    from worker_common import append_record, leave_group, run_and_exit

Nothing here needs pytest, so it imports under torch 1.13 and the torch 2.x venv alike.
"""
import gc
import json
import os
import sys

import torch.distributed as dist


def append_record(path, entry):
    """One JSON line at the end of path (tests/lib/jobs.py's records() reads them back)."""
    with open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")


def leave_group():
    """Leaves the gloo process group in the order that avoids torch 1.13's teardown deadlock:
    ~ProcessGroupGloo joins its worker threads while holding the GIL, and deadlocks if a
    worker thread still frees a tensor that has a Python object. The caller drops its models,
    optimizers and tensors first; collecting garbage and ending with a barrier leaves the
    threads idle when the group is destroyed (as examples/python/ddp_gloo.py does)."""
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def run_and_exit(main):
    """Runs main() and ends the process with exit code 0 without interpreter finalization:
    with Gloo, a worker thread still freeing a tensor that has a Python object aborts the
    process there (see examples/python/ddp_gloo.py). Output is flushed first, since
    os._exit skips that too. An exception from main() propagates as usual (exit code 1)."""
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
