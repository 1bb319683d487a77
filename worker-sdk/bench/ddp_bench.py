"""Python side of `scripts/bench ddp`: PyTorch's own DistributedDataParallel (torch 1.13 at
/usr/bin/python3) on the model, data sizes, optimizer and schedule of ddp_bench.cpp.

Start with 2 ranks under ddprun/torchrun; rank 0 prints
`result impl=python mode=<ddp|local> step_ms=<slowest rank's mean step time>`.
"""
import argparse
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(1024, 2048)
        self.fc2 = torch.nn.Linear(2048, 2048)
        self.fc3 = torch.nn.Linear(2048, 10)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["ddp", "local"], default="ddp")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = Mlp()
    net = torch.nn.parallel.DistributedDataParallel(model) if args.mode == "ddp" else model
    torch.manual_seed(1 + dist.get_rank())
    x = torch.randn(args.batch, 1024)
    y = torch.randint(0, 10, (args.batch,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    ms = (time.perf_counter() - t0) * 1000 / args.steps
    t = torch.tensor([ms], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        print(f"result impl=python mode={args.mode} step_ms={t.item():.3f}", flush=True)
    dist.barrier()  # nobody leaves while a peer still talks to its store


if __name__ == "__main__":
    main()
