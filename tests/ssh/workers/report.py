"""Test worker for `ddprun --hosts`: prints one line with its ranks, the variables named on the
command line and its arguments, then, by option:

    report.py [--gloo] [--fail-node N --code C] [--hold DIR] [--vars A,B] [-- ARGS...]

--gloo: joins a Gloo group and all-reduces its rank (prints the sum);
--fail-node N --code C: local rank 0 of node N exits with C (with --hold: once every worker
    has written its file);
--hold DIR: writes DIR/<rank> with its pid, then sleeps until stopped.
"""
import argparse
import json
import os
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--gloo", action="store_true")
p.add_argument("--fail-node", type=int, default=-1)
p.add_argument("--code", type=int, default=1)
p.add_argument("--hold")
p.add_argument("--vars", default="")
p.add_argument("rest", nargs="*")
a = p.parse_args()

env = os.environ
names = [v for v in a.vars.split(",") if v]


def say(fd, text):
    os.write(fd, (text + "\n").encode())  # one write: workers of a node share the stream


say(1, f"worker RANK={env['RANK']} WORLD_SIZE={env['WORLD_SIZE']} GROUP_RANK={env['GROUP_RANK']} "
    f"LOCAL_RANK={env['LOCAL_RANK']} vars={json.dumps({n: env.get(n) for n in names})} "
    f"args={json.dumps(a.rest)}")
say(2, f"worker {env['RANK']} on stderr")

if a.gloo:
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="env://")
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    say(1, f"worker {env['RANK']} sum={t.item():g}")
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # skip finalization with Gloo threads (see examples/python/ddp_gloo.py)

if a.hold:
    with open(os.path.join(a.hold, env["RANK"]), "w") as f:
        f.write(str(os.getpid()))
if a.fail_node == int(env["GROUP_RANK"]) and env["LOCAL_RANK"] == "0":
    deadline = time.monotonic() + 60
    while a.hold and len(os.listdir(a.hold)) < int(env["WORLD_SIZE"]) and time.monotonic() < deadline:
        time.sleep(0.05)  # a test worker: every worker is up before this one fails
    sys.exit(a.code)
if a.hold:
    while True:
        time.sleep(1)
