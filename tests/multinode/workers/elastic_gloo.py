"""An elastic PyTorch DDP job over Gloo that survives losing a node: it checkpoints and resumes.

    elastic_gloo.py --dir DIR --steps N [--every K] [--delay S]

Every rank trains the same linear model with DistributedDataParallel on a deterministic
global batch of 12 rows per step (split across the ranks, so 2 or 3 ranks see the same data
per step). Rank 0 writes DIR/ckpt.pt every K steps (temp file + rename) and DIR/progress
(the last checkpointed step); a restarted group resumes from the checkpoint. Every worker
appends its pid to DIR/pids.jsonl when it starts; at the end rank 0 writes DIR/result.json and
every rank appends its view to DIR/ranks.jsonl.
"""
import argparse
import json
import os
import pathlib
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "lib" / "workers"))
from worker_common import append_record, leave_group, run_and_exit  # noqa: E402


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(12, 8, generator=g)
    y = x @ torch.arange(1.0, 9.0).unsqueeze(1)
    return x, y


@record
def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--delay", type=float, default=0.05)
    a = p.parse_args()

    append_record(os.path.join(a.dir, "pids.jsonl"),
                  {"pid": os.getpid(), "GROUP_RANK": os.environ["GROUP_RANK"],
                   "RANK": os.environ["RANK"]})
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    start = 0
    ckpt = os.path.join(a.dir, "ckpt.pt")
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        start = state["step"]
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for step in range(start, a.steps):
        x, y = batch(step)
        rows = list(range(rank, 12, world))
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x[rows]), y[rows]).backward()
        opt.step()
        if rank == 0 and (step + 1) % a.every == 0:
            tmp = ckpt + ".tmp"
            torch.save({"model": model.state_dict(), "step": step + 1}, tmp)
            os.replace(tmp, ckpt)
            with open(os.path.join(a.dir, "progress.tmp"), "w") as f:
                f.write(str(step + 1))
            os.replace(os.path.join(a.dir, "progress.tmp"), os.path.join(a.dir, "progress"))
        time.sleep(a.delay)

    flat = torch.cat([q.detach().flatten() for q in model.parameters()])
    total = flat.clone()
    dist.all_reduce(total)
    assert torch.allclose(total / world, flat, atol=1e-6), "replicas diverged"
    append_record(os.path.join(a.dir, "ranks.jsonl"), {k: os.environ[k] for k in (
        "RANK", "GROUP_RANK", "GROUP_WORLD_SIZE", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT",
        "MASTER_ADDR")})
    if rank == 0:
        with open(os.path.join(a.dir, "result.json"), "w") as f:
            json.dump({"world_size": world, "resumed_from": start, "steps": a.steps,
                       "params": flat.tolist()}, f)
    del ddp, opt
    leave_group()


if __name__ == "__main__":
    run_and_exit(main)
