"""One rank of a gloo process group that rendezvouses through the agent's store (env://
with TORCHELASTIC_USE_AGENT_STORE=True), then checks all_reduce and barrier results.
Runs under torch 1.13 and torch 2.x alike."""
import datetime

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    assert t.item() == world * (world + 1) / 2, t
    dist.barrier()
    x = torch.arange(4096, dtype=torch.float32) * (rank + 1)
    dist.all_reduce(x)
    assert torch.equal(x, torch.arange(4096, dtype=torch.float32) * (world * (world + 1) / 2))
    gathered = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(gathered, torch.tensor([float(rank)]))
    assert [g.item() for g in gathered] == list(range(world))
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}/{world} OK torch {torch.__version__}", flush=True)


main()
