"""PyTorch's DistributedDataParallel and ZeroRedundancyOptimizer on the model, data and steps of
zero_worker.cpp (keep the two in step): the reference test_zero.py compares the C++ SDK with.

    zero_ref.py --optim sgd|adam --sizes 6,16,16,4 --steps N [--bucket-view 0|1]
                [--params 0|1] --out DIR

Writes DIR/py_rank<R>.json with the keys zero_worker.cpp writes. "local_state_bytes" counts the
state tensors of this rank's optimizer except Adam's "step" (a tensor in Python, an integer in
LibTorch).
"""
import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

import reftool


class Mlp(torch.nn.Module):
    def __init__(self, sizes):
        super().__init__()
        self.n = len(sizes) - 1
        for i in range(self.n):
            setattr(self, f"fc{i}", torch.nn.Linear(sizes[i], sizes[i + 1]))
        reftool.init_deterministic(self)

    def forward(self, x):
        for i in range(self.n):
            x = getattr(self, f"fc{i}")(x)
            if i + 1 < self.n:
                x = torch.tanh(x)
        return x


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--optim", default="sgd")
    parser.add_argument("--sizes", default="6,16,16,4")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--bucket-view", default="0")
    parser.add_argument("--params", default="1")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    net = Mlp(sizes)
    ddp = DistributedDataParallel(net)
    if args.optim == "adam":
        optim_class, defaults = torch.optim.Adam, {"lr": 0.01}
    else:
        optim_class, defaults = torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=optim_class,
                                  parameters_as_bucket_view=args.bucket_view == "1", **defaults)

    batch, width, out_dim = 8, sizes[0], sizes[-1]
    for step in range(args.steps):
        opt.zero_grad()
        base = torch.arange(batch * width).to(torch.float).reshape(batch, width)
        x = torch.sin(base * 0.37 + float(step * 7 + rank * 3))
        y = torch.cos(torch.arange(batch * out_dim).to(torch.float).reshape(batch, out_dim) * 0.23
                      + float(step + rank))
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()

    params = list(net.parameters())
    owners = [opt._param_to_rank[p] for p in params]
    state_bytes = sum(t.numel() * t.element_size()
                      for s in opt.optim.state.values() for k, t in s.items()
                      if torch.is_tensor(t) and k != "step")
    report = {
        "params": ({n: p.detach().reshape(-1).tolist() for n, p in net.named_parameters()}
                   if args.params == "1" else {}),
        "owners": owners,
        "numels": [p.numel() for p in params],
        "local_state_bytes": state_bytes,
        "torch": torch.__version__,
    }
    with open(os.path.join(args.out, f"py_rank{rank}.json"), "w") as f:
        json.dump(report, f)
    # Tear down as examples/python/ddp_gloo.py does (torch 1.13's Gloo exit-time deadlock; 2.x
    # can abort in the group's destructor at interpreter exit, hence os._exit below).
    del ddp, opt, params
    reftool.tear_down()


if __name__ == "__main__":
    reftool.run(main)
