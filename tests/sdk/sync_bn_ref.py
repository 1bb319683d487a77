"""The reference test_sync_batchnorm.py compares sync_bn_worker.cpp with (keep the two in step).

SyncBatchNorm is defined to equal BatchNorm over the global batch, the concatenation of every
rank's rows. PyTorch's own SyncBatchNorm refuses CPU tensors, so the default reference is that
definition: one process, plain torch.nn.BatchNorm2d/1d on the whole batch, same model, init,
data and SGD steps as the C++ worker.

    sync_bn_ref.py --split even|uneven|empty --loss scaled|mean --steps N --out DIR

writes DIR/ref.json: {"params", "buffers", "outputs" (per step, all rows), "eval_output"}.
--impl per-rank-batchnorm normalises each rank's rows on their own instead (what DDP without
SyncBatchNorm computes): a negative control the test expects not to match.

The loss. DDP averages the ranks' gradients, and SyncBatchNorm's backward makes each rank's
input gradient that of the sum of all ranks' losses, so the C++ job follows the gradient of
(1/world) * sum over ranks r of L_r:
- "scaled": L_r = (sum of rank r's squared errors) * world / (global element count): the
  average is the global mean squared error, for any split (a rank with no rows adds 0);
- "mean": L_r = mean of rank r's squared errors (what training code usually writes): the
  average weights a row of rank r by 1 / (world * n_r), which is the global mean only when every
  rank has the same n_r. The reference uses exactly those row weights.

With --impl torch-syncbn (under a launcher, one process per rank, CUDA + NCCL, two GPUs) it
runs PyTorch's real SyncBatchNorm instead: torch.nn.SyncBatchNorm.convert_sync_batchnorm and
DistributedDataParallel, each rank on its slice, writing DIR/torch_rank<R>.json in the C++
worker's format. PyTorch's SyncBatchNorm runs only on GPUs, so this is skipped elsewhere.
"""
import argparse
import gc
import json
import os
import sys

import torch

BATCH = 8
COUNTS = {"even": [4, 4], "uneven": [6, 2], "empty": [8, 0]}


def init_deterministic(module):
    with torch.no_grad():
        for k, p in enumerate(module.parameters()):
            t = torch.arange(p.numel()).to(torch.float)
            p.copy_((torch.sin(t * 0.7 + k) * 0.3 + (1.0 if k % 4 == 2 else 0.0)).reshape(p.shape))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1),
                                            torch.nn.BatchNorm2d(4), torch.nn.ReLU())
        self.head = torch.nn.Sequential(torch.nn.Linear(64, 6),
                                        torch.nn.BatchNorm1d(6, momentum=None),
                                        torch.nn.ReLU(), torch.nn.Linear(6, 2))
        init_deterministic(self)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def global_batch(step):
    rows = torch.arange(BATCH).to(torch.float).reshape(BATCH, 1, 1, 1)
    x = (torch.sin(torch.arange(BATCH * 3 * 16).to(torch.float).reshape(BATCH, 3, 4, 4) * 0.37
                   + step * 1.3) * (1 + 0.5 * torch.cos(rows)) + 0.2 * rows)
    y = torch.cos(torch.arange(BATCH * 2).to(torch.float).reshape(BATCH, 2) * 0.23 + step)
    return x, y


def row_weights(split, loss):
    """Each row's weight in the global loss the C++ job's gradients follow (see above)."""
    counts, world = COUNTS[split], len(COUNTS[split])
    if loss == "scaled":
        return torch.full((BATCH, 1), 1.0 / (BATCH * 2))
    return torch.cat([torch.full((n, 1), 1.0 / (world * n * 2)) for n in counts if n > 0])


def flat(t):
    return t.detach().double().reshape(-1).tolist()


def report(net, outputs, eval_output):
    return {
        "params": {n: flat(p) for n, p in net.named_parameters()},
        "buffers": {n: flat(b) for n, b in net.named_buffers()},
        "outputs": outputs,
        "eval_output": flat(eval_output),
        "torch": torch.__version__,
    }


def run_reference(args):
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    weights = row_weights(args.split, args.loss)
    outputs = []
    for step in range(args.steps):
        opt.zero_grad()
        x, y = global_batch(step)
        if args.impl == "per-rank-batchnorm":
            # A negative control: each rank's rows normalised on their own.
            out = torch.cat([net(part) for part in x.split(COUNTS[args.split]) if len(part)])
        else:
            out = net(x)
        ((out - y).square() * weights).sum().backward()
        opt.step()
        outputs.append(flat(out))
    net.eval()
    with torch.no_grad():
        eval_output = net(global_batch(args.steps)[0])
    with open(os.path.join(args.out, "ref.json"), "w") as f:
        json.dump(report(net, outputs, eval_output), f)


def run_torch_syncbn(args):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("nccl", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    torch.backends.cudnn.deterministic = True
    # TF32 convolutions (cuDNN's default on Ampere and later) round to 10-bit mantissas.
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    counts = COUNTS[args.split]
    first, count = sum(counts[:rank]), counts[rank]
    net = torch.nn.SyncBatchNorm.convert_sync_batchnorm(Net()).to(device)
    ddp = DistributedDataParallel(net, device_ids=[device.index])
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    outputs = []
    for step in range(args.steps):
        opt.zero_grad()
        x, y = (t.narrow(0, first, count).to(device) for t in global_batch(step))
        out = ddp(x)
        err = (out - y).square()
        loss = err.mean() if args.loss == "mean" else err.sum() * (world / (BATCH * 2))
        loss.backward()
        opt.step()
        outputs.append(flat(out.cpu()))
    net.eval()
    with torch.no_grad():
        eval_output = net(global_batch(args.steps)[0].to(device)).cpu()
    result = report(net, outputs, eval_output)
    result["rows"] = [first, count]
    with open(os.path.join(args.out, f"torch_rank{rank}.json"), "w") as f:
        json.dump(result, f)
    del ddp, opt
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--split", default="even", choices=sorted(COUNTS))
    parser.add_argument("--loss", default="scaled", choices=["scaled", "mean"])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--impl", default="batchnorm", choices=["batchnorm", "per-rank-batchnorm", "torch-syncbn"])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.impl != "torch-syncbn":
        torch.set_num_threads(1)
        run_reference(args)
    else:
        run_torch_syncbn(args)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
