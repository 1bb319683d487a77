"""PyTorch's DistributedDataParallel.join() on the model, data and steps of join_worker.cpp (keep
the two in step): the reference test_join.py compares the C++ SDK's Join with.

    join_ref.py --batches B0,B1 [--divide-initial 1|0] [--find-unused 0|1] [--throw-early 0|1]
                [--hook none|allreduce] [--no-sync-every K] --out DIR

Writes DIR/py_rank<R>.json with the keys join_worker.cpp writes.
"""
import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import reftool


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 8)
        self.bn = torch.nn.BatchNorm1d(8)
        self.fc2 = torch.nn.Linear(8, 4)
        self.extra = torch.nn.Linear(8, 4)
        reftool.init_deterministic(self)

    def forward(self, x, use_extra):
        h = torch.tanh(self.bn(self.fc1(x)))
        out = self.fc2(h)
        if use_extra:
            out = out + self.extra(h)
        return out


def tensors(named):
    return {n: t.detach().to(torch.double).reshape(-1).tolist() for n, t in named}


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", required=True)
    parser.add_argument("--divide-initial", default="1")
    parser.add_argument("--find-unused", default="0")
    parser.add_argument("--throw-early", default="0")
    parser.add_argument("--hook", default="none")
    parser.add_argument("--no-sync-every", type=int, default=0)
    parser.add_argument("--zero-grad", default="last")
    parser.add_argument("--out", required=True)
    return parser.parse_args()


def batch(step, rank):
    """The seeded (x, y) of one step on one rank."""
    base = torch.arange(8 * 6).to(torch.float).reshape(8, 6)
    x = torch.sin(base * 0.37 + float(step * 7 + rank * 3))
    y = torch.cos(torch.arange(8 * 4).to(torch.float).reshape(8, 4) * 0.23 + float(step + rank))
    return x, y


def main():
    args = parse_args()
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    mine = [int(b) for b in args.batches.split(",")][rank]
    find_unused = args.find_unused == "1"
    net = Net()
    ddp = DistributedDataParallel(net, find_unused_parameters=find_unused)
    if args.hook == "allreduce":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    throw_early = args.throw_early == "1"
    error = None
    try:
        with ddp.join(divide_by_initial_world_size=args.divide_initial == "1",
                      throw_on_early_termination=throw_early):
            for step in range(mine):
                x, y = batch(step, rank)
                use_extra = not find_unused or (step + rank) % 3 == 0
                if args.no_sync_every > 0 and step % args.no_sync_every == 0:
                    with ddp.no_sync():
                        torch.nn.functional.mse_loss(ddp(x, use_extra), y).backward()
                    continue
                if args.zero_grad == "first":
                    opt.zero_grad()
                torch.nn.functional.mse_loss(ddp(x, use_extra), y).backward()
                opt.step()
                if args.zero_grad != "first":
                    opt.zero_grad()
    except RuntimeError as e:
        if not throw_early:
            raise
        error = str(e)

    if error is not None:
        report = {"error": error}
    else:
        report = {"params": tensors(net.named_parameters()),
                  "buffers": tensors(net.named_buffers()),
                  "grads": {n: None if p.grad is None else p.grad.to(torch.double).reshape(-1).tolist()
                            for n, p in net.named_parameters()},
                  "steps": mine}
    with open(os.path.join(args.out, f"py_rank{rank}.json"), "w") as f:
        json.dump(report, f)
    # Tear down as examples/python/ddp_gloo.py does (torch 1.13's Gloo exit-time deadlock).
    del ddp, opt
    if error is None:
        reftool.tear_down()


if __name__ == "__main__":
    reftool.run(main)
