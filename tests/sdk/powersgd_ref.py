"""PyTorch's DDP with powerSGD_hook (or allreduce_hook) on the model, data and schedule of
powersgd_worker.cpp (keep the two in step): the reference test_comm_hooks.py compares with.

    powersgd_ref.py --model small|bench --hook powersgd|allreduce --steps N --rank R
                    --start S --seed K --out DIR

Rank 0 writes DIR/py.json: {"loss": [...], "bytes": [...], "iter": N}. Bytes are counted by
wrapping torch.distributed.all_reduce, which the hooks call for every collective they issue.
"""
import argparse
import json
import math
import os
import threading

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

import reftool


class Mlp(torch.nn.Module):
    def __init__(self, d_in, hidden, hidden2, out):
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, hidden)
        self.fc2 = torch.nn.Linear(hidden, hidden2) if hidden2 else None
        self.fc3 = torch.nn.Linear(hidden2 or hidden, out)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        if self.fc2 is not None:
            x = F.relu(self.fc2(x))
        return self.fc3(x)


def init_weights(module):
    with torch.no_grad():
        for k, p in enumerate(module.parameters()):
            torch.manual_seed(1000 + k)
            fan_in = p.shape[1] if p.dim() > 1 else 16.0
            p.copy_(torch.randn(p.shape) / math.sqrt(fan_in))


def rank_data(bench, rank, world):
    """This rank's share of the seeded data set: classes for the bench model, a smooth target
    for the small one."""
    d_in, out = (1024, 10) if bench else (32, 8)
    torch.manual_seed(7)
    x_all = torch.randn(512, d_in)
    if bench:
        y_all = torch.randint(0, out, (512,))
    else:
        t1 = torch.randn(d_in, 16) / math.sqrt(d_in)
        t2 = torch.randn(16, out)
        y_all = torch.tanh(x_all @ t1) @ t2
    mine = torch.arange(rank, 512, world)
    return x_all.index_select(0, mine), y_all.index_select(0, mine)


def wrap(net, args, bench):
    """The model in DDP with --hook; returns it and PowerSGD's state (None for allreduce)."""
    if bench:
        # One bucket (the 25 MB of gradients fit the default 25 MiB cap once the 1 MiB first
        # bucket is lifted; DDP's constructor reads this in 1.13 and 2.x alike). PyTorch's
        # powerSGD_hook over Gloo with several buckets issues its follow-up all-reduces from
        # Gloo's callback threads, in an order that differs between ranks: 1.13 aborts
        # ("op.preamble.length <= op.nbytes"), 2.x hangs. Bytes on the wire do not depend on
        # the bucketing.
        dist._DEFAULT_FIRST_BUCKET_BYTES = 64 << 20
    ddp = DistributedDataParallel(net)
    state = None
    if args.hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=args.rank,
            start_powerSGD_iter=args.start, random_seed=args.seed)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    else:
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    return ddp, state


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="small", choices=["small", "bench"])
    p.add_argument("--hook", default="powersgd", choices=["powersgd", "allreduce"])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--rank", type=int, default=2)
    p.add_argument("--start", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    return p.parse_args()


def main():
    args = parse_args()

    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    bench = args.model == "bench"

    # Count what the hooks hand to all_reduce (they look it up on torch.distributed at call time).
    real_all_reduce = dist.all_reduce
    counted = [0]
    lock = threading.Lock()

    def counting_all_reduce(tensor, *a, **kw):
        with lock:
            counted[0] += tensor.numel() * tensor.element_size()
        return real_all_reduce(tensor, *a, **kw)

    dist.all_reduce = counting_all_reduce

    net = Mlp(1024, 2048, 2048, 10) if bench else Mlp(32, 64, 0, 8)
    init_weights(net)
    x_rank, y_rank = rank_data(bench, rank, world)
    ddp, state = wrap(net, args, bench)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    losses, per_step = [], []
    last = 0
    batch = 64 if bench else 32
    chunks = x_rank.shape[0] // batch
    for step in range(args.steps):
        c = step % chunks
        x, y = x_rank[c * batch:(c + 1) * batch], y_rank[c * batch:(c + 1) * batch]
        opt.zero_grad()
        pred = ddp(x)
        loss = F.cross_entropy(pred, y) if bench else F.mse_loss(pred, y)
        loss.backward()
        opt.step()
        with lock:
            now = counted[0]
        per_step.append(now - last)
        last = now
        l = loss.detach().clone()
        real_all_reduce(l)
        losses.append(l.item() / world)

    if rank == 0:
        with open(os.path.join(args.out, "py.json"), "w") as f:
            json.dump({"loss": losses, "bytes": per_step,
                       "iter": state.iter if state else args.steps,
                       "torch": torch.__version__}, f)
    # Tear down as ddp_equiv_ref.py does (torch 1.13's Gloo exit-time deadlock).
    dist.all_reduce = real_all_reduce
    del ddp, opt, state
    reftool.tear_down()


if __name__ == "__main__":
    reftool.run(main)
