"""A real PyTorch DDP job over Gloo (CPU), runnable unchanged under torchrun or ddprun.

Trains a small regression model with DistributedDataParallel on a DistributedSampler (with
set_epoch), checks that every rank ends with identical parameters, exercises all_reduce and
all_gather_object, and has rank 0 write a JSON report to --out.

    ddprun --standalone --nproc_per_node=2 examples/python/ddp_gloo.py --out /tmp/r.json

With --fail-on-first-attempt R, rank R raises on attempt 0 after one all_reduce, so a run
with --max_restarts=1 checks that the restarted group initialises again (fresh store).
"""
import argparse
import gc
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


@record
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--fail-on-first-attempt", type=int, default=-1, metavar="RANK",
                        help="this rank raises after the first all_reduce of attempt 0")
    args = parser.parse_args()

    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if args.fail_on_first_attempt >= 0 and attempt == 0:
        probe = torch.ones(1)
        dist.all_reduce(probe)  # every rank: the group is up before one of them fails
        if rank == args.fail_on_first_attempt:
            raise RuntimeError(f"planned failure of rank {rank} after all_reduce={probe.item()}")

    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=1)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)

    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    seen = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        seen.append(list(sampler))
        for xb, yb in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(xb), yb).backward()
            opt.step()

    # Every rank must hold the same parameters after DDP's gradient all-reduce.
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    total = flat.clone()
    dist.all_reduce(total)
    assert torch.allclose(total / world, flat, atol=1e-6), "replicas diverged"

    ones = torch.ones(1) * (rank + 1)
    dist.all_reduce(ones)
    gathered = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "indices": seen,
                                      "restart": os.environ["TORCHELASTIC_RESTART_COUNT"]})
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"world_size": world, "rank_sum": ones.item(), "gathered": gathered,
                       "params": flat.tolist(), "torch": torch.__version__}, f)
    # Tear down in this order: torch 1.13's ~ProcessGroupGloo joins its worker threads while
    # holding the GIL, and deadlocks if a worker thread is still freeing a tensor that has a
    # Python object. Dropping DDP (and our tensors) first and ending with a barrier leaves the
    # threads idle when the process group is destroyed.
    del model, opt, flat, total, ones
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Skip interpreter finalization: with Gloo, a worker thread still freeing a tensor that has
    # a Python object aborts the process there ("terminate called without an active
    # exception", seen with torch 2.x under load; see pytorch/pytorch#179291).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
