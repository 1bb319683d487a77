"""A 2-node gloo DDP job for tests/recovery/test_memory_replication.py: each rank saves its
state to ddprun's in-memory checkpoint after step 10 (under its own name, as a sharded state
would be), says so, and waits for DIR/go; a rank that finds its checkpoint resumes from it.
Each start is appended to DIR/starts.jsonl; the final parameters go to DIR/final_<rank>.json.

    replica_train.py DIR
"""
import json
import os
import pathlib
import sys
import time

import ddprun
import torch
import torch.distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "lib" / "workers"))
from worker_common import append_record, leave_group, run_and_exit  # noqa: E402

SAVE_AT, STEPS = 10, 20


def main():
    d = pathlib.Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    start = 0
    state = ddprun.load_checkpoint(f"rank{rank}")
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    append_record(d / "starts.jsonl", {"rank": rank, "start": start, "pid": os.getpid(),
                                       "node": os.environ["GROUP_RANK"],
                                       "dir": os.environ.get("DDPRUN_MEMORY_CHECKPOINT_DIR")})
    for step in range(start, STEPS):
        g = torch.Generator().manual_seed(step * 100 + rank)
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
        opt.zero_grad()
        ((ddp(x) - y) ** 2).mean().backward()
        opt.step()
        if step + 1 == SAVE_AT and start == 0:
            ddprun.save_checkpoint({"model": model.state_dict(), "opt": opt.state_dict(),
                                    "step": SAVE_AT}, f"rank{rank}", wait=True)
            (d / f"saved_{rank}").touch()
            while not (d / "go").exists():
                time.sleep(0.05)
    (d / f"final_{rank}.json").write_text(
        json.dumps([p.detach().flatten().tolist() for p in model.parameters()]))
    del ddp, model, opt
    leave_group()


if __name__ == "__main__":
    run_and_exit(main)
