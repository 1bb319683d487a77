"""Python twin of sdk_probe.cpp: the same collectives through torch.distributed (gloo)."""
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.full((3,), float(rank + 1))
dist.all_reduce(t)
parts = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
dist.all_gather(parts, torch.tensor([rank * 10]))
b = torch.tensor([42.0 if rank == 0 else -1.0], dtype=torch.float64)
dist.broadcast(b, 0)
dist.barrier()
gathered = ",".join(str(int(p.item())) for p in parts)
sys.stdout.write(f"probe impl=python rank={rank} world={world} sum={t[0].item():g} "
                 f"gathered={gathered} broadcast={b.item():g}\n")  # one write: shared console
sys.stdout.flush()
dist.destroy_process_group()
