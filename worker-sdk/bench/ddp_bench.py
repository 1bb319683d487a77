"""Python side of `scripts/bench ddp`: PyTorch's own DistributedDataParallel (torch 1.13 at
/usr/bin/python3) on the model, data sizes, optimizer and schedule of ddp_bench.cpp.

Start with 2 ranks under ddprun/torchrun; rank 0 prints
`result impl=python mode=<ddp|local> step_ms=<slowest rank's mean step time> bytes=<bytes
handed to all-reduce per timed step>`. Variants of --mode ddp, as ddp_bench.cpp's:
--find-unused 1 (find_unused_parameters=True), --hook allreduce|powersgd (default_hooks.
allreduce_hook, powerSGD_hook with --psgd-rank/--psgd-start), --optim zero-adam
(torch.distributed.optim.ZeroRedundancyOptimizer over Adam; adds `state=<largest rank's
optimizer state bytes> state_total=<sum over ranks>`). Bytes: with a hook, counted by
wrapping torch.distributed.all_reduce, which the hooks call; without, the gradients' size (what
DDP's C++ reducer all-reduces, out of Python's sight).
"""
import argparse
import os
import sys
import threading
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


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["ddp", "local"], default="ddp")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--find-unused", choices=["0", "1"], default="0")
    p.add_argument("--hook", choices=["none", "allreduce", "powersgd"], default="none")
    p.add_argument("--psgd-rank", type=int, default=4)
    p.add_argument("--psgd-start", type=int, default=2)
    p.add_argument("--optim", choices=["sgd", "zero-adam"], default="sgd")
    args = p.parse_args()
    if args.hook == "powersgd" and args.psgd_start > args.warmup:
        p.error("--psgd-start must not exceed --warmup (time compressed steps)")
    return args


def wrap(model, args):
    """--mode ddp: the model in DDP with --find-unused and --hook."""
    if args.hook == "powersgd":
        # One bucket: powerSGD_hook over Gloo with several buckets issues its follow-up
        # all-reduces from Gloo's callback threads in an order that differs between ranks
        # (1.13 aborts, 2.x hangs). ddp_bench.cpp uses one bucket too.
        dist._DEFAULT_FIRST_BUCKET_BYTES = 64 << 20
    net = torch.nn.parallel.DistributedDataParallel(
        model, find_unused_parameters=args.find_unused == "1")
    if args.hook == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=args.psgd_rank,
            start_powerSGD_iter=args.psgd_start)
        net.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif args.hook == "allreduce":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        net.register_comm_hook(None, default_hooks.allreduce_hook)
    return net


def zero_state_text(opt):
    """The text " state=<the largest rank's optimizer state bytes> state_total=<all ranks'>"
    (a collective: every rank calls it)."""
    mine = sum(v.numel() * v.element_size() for st in opt.optim.state.values()
               for v in st.values() if torch.is_tensor(v))
    largest = torch.tensor([mine], dtype=torch.int64)
    total = largest.clone()
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    dist.all_reduce(total)
    return f" state={largest.item()} state_total={total.item()}"


def main():
    args = parse_args()

    dist.init_process_group("gloo")
    real_all_reduce = dist.all_reduce
    counted = [0]
    lock = threading.Lock()

    def counting_all_reduce(tensor, *a, **kw):
        with lock:
            counted[0] += tensor.numel() * tensor.element_size()
        return real_all_reduce(tensor, *a, **kw)

    torch.manual_seed(0)
    model = Mlp()
    net = model
    if args.mode == "ddp":
        net = wrap(model, args)
        if args.hook != "none":
            dist.all_reduce = counting_all_reduce
    torch.manual_seed(1 + dist.get_rank())
    x = torch.randn(args.batch, 1024)
    y = torch.randint(0, 10, (args.batch,))
    if args.optim == "zero-adam":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    dist.barrier()
    with lock:
        bytes0 = counted[0]
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    ms = (time.perf_counter() - t0) * 1000 / args.steps
    with lock:
        hooked = (counted[0] - bytes0) // args.steps
    dist.all_reduce = real_all_reduce
    if args.mode == "local":
        per_step = 0
    elif args.hook == "none":
        per_step = sum(p.numel() * p.element_size() for p in model.parameters())
    else:
        per_step = hooked
    t = torch.tensor([ms], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    state = zero_state_text(opt) if args.optim == "zero-adam" else ""
    if dist.get_rank() == 0:
        print(f"result impl=python mode={args.mode} step_ms={t.item():.3f} bytes={per_step}"
              f"{state}", flush=True)
    dist.barrier()  # nobody leaves while a peer still talks to its store


if __name__ == "__main__":
    main()
    # Skip interpreter finalization, where torch's Gloo threads sometimes abort the process
    # ("terminate called without an active exception"; see examples/python/ddp_gloo.py).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
