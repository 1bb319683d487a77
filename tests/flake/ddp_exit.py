"""examples/python/ddp_gloo.py without its os._exit(0) workaround: the interpreter exits normally.

A small DDP job over Gloo on CPU (DistributedSampler, a few SGD steps, all_reduce,
all_gather_object), then the same teardown as ddp_gloo.py (drop DDP and tensors, gc, barrier,
destroy_process_group), then a plain return from the script, so CPython finalizes the
interpreter and runs the C++ static destructors. This is the exit path where the "terminate
called without an active exception" abort was reported (see tests/flake/README.md).

    ddprun   --standalone --nproc-per-node 2 tests/flake/ddp_exit.py
    torchrun --standalone --nproc-per-node 2 tests/flake/ddp_exit.py

Options vary the teardown, to see which part of it matters:
  --teardown full      ddp_gloo.py's teardown (default)
  --teardown destroy   destroy_process_group() only, no del/gc/barrier
  --teardown none      no destroy_process_group(): the process group dies at finalization
--epochs N sets the amount of work (default 2, as ddp_gloo.py). --out PATH makes rank 0 write
a small JSON report. --exit-probe DIR logs the exit's timeline and a gdb dump of every
thread taken --probe-delay seconds after the teardown starts. --pid-file DIR makes every rank write DIR/<rank>.pid and its
/proc/self/status signal masks, process group, session and environment, for the comparison
of launchers.
"""
import argparse
import gc
import json
import os

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def dump_process_facts(directory, rank):
    """Record what a launcher could change about this worker: signals, group, stdin, env."""
    facts = {"pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0),
             "sid": os.getsid(0), "tty_stdin": os.isatty(0)}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in ("SigQ", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt", "Threads"):
                facts[key] = line.split(":", 1)[1].strip()
    try:
        facts["stdin"] = os.readlink("/proc/self/fd/0")
    except OSError as e:
        facts["stdin"] = f"<{e.strerror}>"
    for fd in (1, 2):
        try:
            facts[f"fd{fd}"] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError as e:
            facts[f"fd{fd}"] = f"<{e.strerror}>"
    with open("/proc/self/limits") as f:
        facts["limits"] = [line.rstrip() for line in f]
    facts["env"] = dict(sorted(os.environ.items()))
    with open(os.path.join(directory, f"{rank}.json"), "w") as f:
        json.dump(facts, f, indent=1)


def start_exit_probe(directory, rank, delay):
    """Timestamps for the end of main() and for the atexit phase, and a gdb stack dump later."""
    import atexit
    import subprocess
    import time
    timeline = open(os.path.join(directory, f"{rank}.timeline"), "a", buffering=1)
    timeline.write(f"{time.time():.6f} teardown-start pid {os.getpid()}\n")
    atexit.register(lambda: timeline.write(f"{time.time():.6f} atexit (finalization starts)\n"))
    subprocess.Popen(
        ["sh", "-c", f"sleep {delay}; echo $(date +%s.%N) gdb-attach; "
                     f"gdb -p {os.getpid()} -batch -nx -ex 'info threads' "
                     f"-ex 'thread apply all bt' 2>&1; echo $(date +%s.%N) gdb-done"],
        stdout=open(os.path.join(directory, f"{rank}.gdb"), "w"), stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True)


@record
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--teardown", choices=("full", "destroy", "none"), default="full")
    parser.add_argument("--pid-file", default=None, metavar="DIR")
    parser.add_argument("--exit-probe", default=None, metavar="DIR",
                        help="log the exit's timeline to DIR/<rank>.timeline and have gdb dump "
                             "every thread's stack --probe-delay seconds after main() returns")
    parser.add_argument("--probe-delay", type=float, default=0.5)
    args = parser.parse_args()

    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.pid_file:
        dump_process_facts(args.pid_file, rank)

    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=1)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)

    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(xb), yb).backward()
            opt.step()

    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    total = flat.clone()
    dist.all_reduce(total)
    assert torch.allclose(total / world, flat, atol=1e-6), "replicas diverged"
    ones = torch.ones(1) * (rank + 1)
    dist.all_reduce(ones)
    gathered = [None] * world
    dist.all_gather_object(gathered, {"rank": rank})
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump({"world_size": world, "rank_sum": ones.item(), "torch": torch.__version__}, f)

    if args.exit_probe:
        start_exit_probe(args.exit_probe, rank, args.probe_delay)

    if args.teardown == "full":  # exactly ddp_gloo.py's teardown
        del model, opt, flat, total, ones
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
    elif args.teardown == "destroy":
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # No os._exit(0) here: this is the point of the study.
