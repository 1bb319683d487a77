"""PyTorch's DistributedDataParallel on the model, data and steps of ddp_equiv.cpp (keep the two
in step): the reference test_ddp_equivalence.py compares the C++ SDK with.

    ddp_equiv_ref.py --mode default|find_unused|static --model branch|frozen|order
                     --pattern steps|rank|always --steps N --out DIR
                     [--hook none|allreduce|fp16|bf16]

--hook registers PyTorch's default_hooks.allreduce_hook / fp16_compress_hook /
bf16_compress_hook (test_comm_hooks.py).

Writes DIR/py_rank<R>.json with the keys ddp_equiv.cpp writes (no ready_order: Python keeps it
private; the rebuilt bucket layout shows it).
"""
import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import reftool


class Net(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        if kind == "order":
            self.a = torch.nn.Linear(16, 4)
            self.b = torch.nn.Linear(16, 4)
            self.body = torch.nn.Linear(6, 16)
        else:
            self.fc1 = torch.nn.Linear(6, 8)
            self.fc2 = torch.nn.Linear(8, 4)
            self.extra = torch.nn.Linear(8, 4)
            self.never = torch.nn.Linear(3, 3)
        reftool.init_deterministic(self)
        if kind == "frozen":
            for p in self.extra.parameters():
                p.requires_grad_(False)

    def forward(self, x, use_branch, rank):
        if self.kind == "order":
            h = torch.tanh(self.body(x))
            if rank == 1:
                yb = self.b(h)
                return self.a(h) + yb
            ya = self.a(h)
            return ya + self.b(h)
        h = torch.tanh(self.fc1(x))
        out = self.fc2(h)
        if self.kind == "frozen":
            out = out + self.extra(h)
            with torch.no_grad():
                dead = self.never(h.narrow(1, 0, 3)).sum(1, keepdim=True)
            return out + dead
        if use_branch:
            out = out + self.extra(h)
        return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="default")
    parser.add_argument("--model", default="branch")
    parser.add_argument("--pattern", default="always")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", required=True)
    parser.add_argument("--hook", default="none", choices=["none", "allreduce", "fp16", "bf16"])
    args = parser.parse_args()

    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    net = Net(args.model)
    if args.model == "order":
        # A small first bucket, so the layout has two buckets. DDP's constructor reads this
        # (1.13 and 2.x alike) when bucket_cap_mb is left at its default; 2.x ignores it otherwise.
        dist._DEFAULT_FIRST_BUCKET_BYTES = 512
    ddp = DistributedDataParallel(net, find_unused_parameters=args.mode == "find_unused",
                                  static_graph=args.mode == "static")
    if args.hook != "none":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        hook = {"allreduce": default_hooks.allreduce_hook,
                "fp16": default_hooks.fp16_compress_hook,
                "bf16": default_hooks.bf16_compress_hook}[args.hook]
        ddp.register_comm_hook(None, hook)
    trainable = [p for p in net.parameters() if p.requires_grad]
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for step in range(args.steps):
        for p in net.parameters():
            if p.grad is not None:
                p.grad.zero_()
        base = torch.arange(8 * 6).to(torch.float).reshape(8, 6)
        x = torch.sin(base * 0.37 + float(step * 7 + rank * 3))
        y = torch.cos(torch.arange(8 * 4).to(torch.float).reshape(8, 4) * 0.23 + float(step + rank))
        use = (args.pattern == "always" or (args.pattern == "rank" and rank == 1)
               or (args.pattern == "steps" and (step + rank) % 3 == 0))
        torch.nn.functional.mse_loss(ddp(x, use, rank), y).backward()
        opt.step()

    index = {id(p): i for i, p in enumerate(trainable)}
    buckets = [[index[id(p)] for p in b.parameters()]
               for b in ddp.reducer._get_zeros_like_grad_buckets()]
    report = {
        "params": {n: p.detach().reshape(-1).tolist() for n, p in net.named_parameters()},
        "grad_none": [n for n, p in net.named_parameters() if p.grad is None],
        "buckets": buckets,
        "torch": torch.__version__,
    }
    with open(os.path.join(args.out, f"py_rank{rank}.json"), "w") as f:
        json.dump(report, f)
    # Tear down as examples/python/ddp_gloo.py does (torch 1.13's Gloo exit-time deadlock).
    del ddp, opt, trainable
    reftool.tear_down()


if __name__ == "__main__":
    reftool.run(main)
