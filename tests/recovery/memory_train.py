"""A deterministic DDP job (gloo, CPU) that saves to ddprun's in-memory checkpoints every step
and resumes from them after a restart: test_memory_checkpoints.py kills a rank mid-job and
compares the final parameters with an undisturbed run's.

    ddprun --standalone --nproc-per-node 2 --max-restarts 1 memory_train.py OUT_DIR \
        [--steps N] [--kill-at STEP]

Rank 0 saves {"model", "optim", "step"} after every step and, at a start, loads it and
broadcasts it (one copy in memory serves the node; the ranks hold the same state). With
--kill-at S, rank 1 SIGKILLs itself during step S of attempt 0. Rank 0 writes OUT_DIR/result.json
at the end: the resumed step of each attempt and a hash of the final parameters.
"""
import argparse
import hashlib
import json
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import ddprun


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--kill-at", type=int, default=-1)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = 0
    # README memory-load begin
    saved = [ddprun.load_checkpoint() if rank == 0 else None]  # rank 0 reads it...
    dist.broadcast_object_list(saved, src=0)  # ...and every rank gets it
    if saved[0] is not None:
        model.load_state_dict(saved[0]["model"])
        opt.load_state_dict(saved[0]["optim"])
        start = saved[0]["step"]
    # README memory-load end
    ddp = DistributedDataParallel(model)
    for step in range(start, args.steps):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(16, 8, generator=g)
        y = x.sum(dim=1, keepdim=True)
        opt.zero_grad()
        if step == args.kill_at and rank == 1 and attempt == 0:
            os.kill(os.getpid(), signal.SIGKILL)  # rank 0 then waits in this step's all-reduce
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        # README memory-save begin
        if rank == 0:  # the ranks hold the same state: one copy serves the node
            ddprun.save_checkpoint({"model": model.state_dict(), "optim": opt.state_dict(),
                                    "step": step + 1})
        # README memory-save end
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                     for p in model.parameters())).hexdigest()[:16]
    if rank == 0:
        with open(os.path.join(args.out, f"attempt{attempt}.json"), "w") as f:
            json.dump({"resumed_at": start, "params": digest,
                       "memory": ddprun.memory_checkpoint_dir()}, f)
    dist.barrier()
    # Leave without the interpreter's shutdown: torch's known exit bugs (examples/python/ddp_gloo.py).
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
