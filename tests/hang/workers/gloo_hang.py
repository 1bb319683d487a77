"""A real torch gloo job whose rank 1 gets stuck outside any collective on attempt 0.

    gloo_hang.py --out FILE [--steps N] [--hang-rank R] [--hang-step S]

Every rank all-reduces in a loop and beats after each step. A rank waiting for its peers stays
alive: it runs the all_reduce asynchronously and beats while it waits, so the only worker that
goes silent is the stuck one. On attempt 0 (TORCHELASTIC_RESTART_COUNT=0) rank R, at step S,
calls stuck_outside_the_collective(), which never returns. Rank 0 writes a JSON report to FILE
when the job completes.
"""
import argparse
import json
import os
import pathlib
import sys
import threading
import time

import torch
import torch.distributed as dist

from beat import heartbeat  # the documented snippet, shared by the test workers

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "lib" / "workers"))
from worker_common import leave_group, run_and_exit  # noqa: E402


def stuck_outside_the_collective():
    threading.Event().wait()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--hang-rank", type=int, default=1)
    p.add_argument("--hang-step", type=int, default=5)
    args = p.parse_args()

    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    heartbeat()
    total = 0.0
    for step in range(args.steps):
        if rank == args.hang_rank and attempt == 0 and step == args.hang_step:
            stuck_outside_the_collective()
        t = torch.ones(1) * (rank + 1)
        work = dist.all_reduce(t, async_op=True)
        while not work.is_completed():
            heartbeat()
            time.sleep(0.02)
        work.wait()
        heartbeat()
        total += t.item()
        time.sleep(0.02)
    expected = args.steps * world * (world + 1) / 2
    assert total == expected, (total, expected)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"attempt": attempt, "world": world, "total": total,
                       "torch": torch.__version__}, f)
    # torch 1.13's ~ProcessGroupGloo deadlocks if a worker thread still frees a tensor: drop
    # ours before leaving the group (worker_common.leave_group).
    del t, work
    leave_group()


if __name__ == "__main__":
    run_and_exit(main)
