"""Test worker: joins a Gloo process group through the variables ddprun set, all-reduces its
rank, checks the sum and writes OUT/env_<RANK>.json with the torchrun variables and the sum.

    gloo_env.py OUT
"""
import json
import os
import sys

import torch
import torch.distributed as dist

KEYS = ["RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE",
        "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT", "SLURM_JOB_ID", "SLURM_NODEID", "SLURM_PROCID"]

out = sys.argv[1]
dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank)])
dist.all_reduce(t)
assert t.item() == world * (world - 1) / 2, t.item()
record = {k: os.environ.get(k) for k in KEYS}
record["sum"] = t.item()
with open(os.path.join(out, f"env_{rank}.json.tmp"), "w") as f:
    json.dump(record, f)
os.rename(os.path.join(out, f"env_{rank}.json.tmp"), os.path.join(out, f"env_{rank}.json"))
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # skip finalization with Gloo threads (see examples/python/ddp_gloo.py)
