"""Worker of the recovery part of tests/bench/rdzv: a gloo job that runs until told to stop.

    rdzv_worker.py STAMPS

Appends "start <restart> <rank> <time> <pid>" to STAMPS as its very first action (before
importing torch), "ready ..." once init_process_group returned, then all-reduces a tensor every
50 ms until it is killed. A peer's death makes the all_reduce raise, as in a real job (torchrun
needs that to notice anything).
"""
import os
import sys
import time


def stamp(kind):
    with open(sys.argv[1], "a") as f:
        f.write(f"{kind} {os.environ['TORCHELASTIC_RESTART_COUNT']} {os.environ['RANK']} "
                f"{time.time():.6f} {os.getpid()}\n")


stamp("start")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo", init_method="env://")
stamp("ready")
t = torch.ones(1)
while True:
    dist.all_reduce(t)
    time.sleep(0.05)
