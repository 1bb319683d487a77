"""Test worker: joins a Gloo process group through the agent's workers' store, records itself,
holds until a file appears (so a test can probe the stores of a running job), then all-reduces
its rank and checks the sum.

    gloo_hold.py LOG GO

LOG gets one JSON line per worker (the torchrun variables a test reads, MASTER_ADDR/PORT
included, and the pid); a second line {"rank", "sum"} after the all-reduce.
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

log, go = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
keys = ["RANK", "GROUP_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "TORCHELASTIC_RESTART_COUNT"]
with open(log, "a") as f:
    f.write(json.dumps({**{k: os.environ.get(k) for k in keys}, "pid": os.getpid()}) + "\n")
while not os.path.exists(go):  # a test worker: the file is its only signal
    time.sleep(0.02)
t = torch.tensor([float(rank)])
dist.all_reduce(t)
assert t.item() == world * (world - 1) / 2, t.item()
with open(log, "a") as f:
    f.write(json.dumps({"rank": rank, "sum": t.item()}) + "\n")
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # skip finalization with Gloo threads (see examples/python/ddp_gloo.py)
