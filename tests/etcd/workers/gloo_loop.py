"""A PyTorch gloo job that trains for as long as a test needs: all_reduce + sleep per step.

    gloo_loop.py --dir DIR [--stop-file F] [--max-steps N] [--delay S]

Every worker appends its torchrun variables and pid to DIR/start.jsonl before joining the
process group. Each step all-reduces [1, stop]: the group leaves together at the first step
where any rank saw --stop-file, or after --max-steps. Rank 0 writes DIR/progress ({"step",
"world", "pid"}) every step, so a test can see training go on, and in which group. At the end
every rank appends to DIR/end.jsonl its step count, the all-reduced world size (which must
equal WORLD_SIZE) and its restart count.
"""
import argparse
import json
import os
import pathlib
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "lib" / "workers"))
from worker_common import append_record, leave_group, run_and_exit  # noqa: E402

KEYS = ["RANK", "LOCAL_RANK", "GROUP_RANK", "GROUP_WORLD_SIZE", "WORLD_SIZE", "MASTER_ADDR",
        "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_RUN_ID"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--stop-file")
    p.add_argument("--max-steps", type=int, default=1000000)
    p.add_argument("--delay", type=float, default=0.05)
    a = p.parse_args()

    start = {k: os.environ.get(k) for k in KEYS}
    start["pid"] = os.getpid()
    append_record(os.path.join(a.dir, "start.jsonl"), start)
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    step, world = 0, 0
    while step < a.max_steps:
        stop = 1.0 if a.stop_file and os.path.exists(a.stop_file) else 0.0
        t = torch.tensor([1.0, stop])
        dist.all_reduce(t)
        step += 1
        world = int(t[0].item())
        if rank == 0:
            tmp = os.path.join(a.dir, "progress.tmp")
            with open(tmp, "w") as f:
                json.dump({"step": step, "world": world, "pid": os.getpid()}, f)
            os.replace(tmp, os.path.join(a.dir, "progress"))
        if t[1].item() > 0:
            break
        time.sleep(a.delay)
    append_record(os.path.join(a.dir, "end.jsonl"),
                  {"RANK": os.environ["RANK"], "steps": step, "world": world,
                   "WORLD_SIZE": os.environ["WORLD_SIZE"],
                   "TORCHELASTIC_RESTART_COUNT": os.environ["TORCHELASTIC_RESTART_COUNT"]})
    leave_group()


if __name__ == "__main__":
    run_and_exit(main)
