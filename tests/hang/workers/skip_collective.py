"""A real torch gloo job whose rank 1 skips a collective on attempt 0 (a plain script: nothing
ddprun-specific but the documented heartbeat snippet).

    skip_collective.py --out FILE [--steps N] [--skip-rank R] [--skip-step S] [--skipper-beats]
                       [--ddprun-module] [--gloo-timeout SEC] [--torch-dump-on-timeout]

Every rank all-reduces 1,000 floats per step and beats after it (so a rank waiting in a
collective goes silent, as in a real job). On attempt 0 (TORCHELASTIC_RESTART_COUNT=0) rank R,
at step S, does not enter that step's all_reduce and sleeps instead: the others wait in it.
Collectives are numbered from 1 per process group, so the stuck one is #S+1 and the skipping
rank's last is #S. With --skipper-beats it keeps beating while it sleeps (it looks alive: only
the waiting ranks go silent). With --ddprun-module it beats with the `ddprun` Python module's
heartbeat() instead of the snippet. --gloo-timeout (default 300) is the process group's own
timeout: a short one makes the waiting ranks fail with gloo's "Timed out waiting"; with
--torch-dump-on-timeout a rank that times out first has torch write its flight recorder (a
pickle, to TORCH_FR_DUMP_TEMP_FILE<rank>), as NCCL does on its own timeout. Rank 0 writes a JSON report to FILE when the job completes.
"""
import argparse
import datetime
import json
import os
import pathlib
import sys
import time

import torch
import torch.distributed as dist

import beat

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "lib" / "workers"))
from worker_common import leave_group, run_and_exit  # noqa: E402


heartbeat = beat.heartbeat


def sleep_instead_of_the_collective(beats):
    while True:
        time.sleep(0.1)
        if beats:
            heartbeat()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--skip-rank", type=int, default=1)
    p.add_argument("--skip-step", type=int, default=4)
    p.add_argument("--skipper-beats", action="store_true")
    p.add_argument("--ddprun-module", action="store_true")
    p.add_argument("--gloo-timeout", type=float, default=300)
    p.add_argument("--torch-dump-on-timeout", action="store_true")
    args = p.parse_args()
    if args.ddprun_module:
        global heartbeat
        import ddprun
        heartbeat = ddprun.heartbeat

    # gloo's own timeout well past the hang timeout: ddprun finds the hang first.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.gloo_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    heartbeat()
    total = 0.0
    for step in range(args.steps):
        if rank == args.skip_rank and attempt == 0 and step == args.skip_step:
            sleep_instead_of_the_collective(args.skipper_beats)
        t = torch.ones(1000)
        try:
            dist.all_reduce(t)
        except RuntimeError:
            if args.torch_dump_on_timeout:
                import torch._C._distributed_c10d as c10d
                c10d._dump_fr_trace_file(rank)
            raise
        total += t[0].item()
        heartbeat()
        time.sleep(0.05)
    assert total == args.steps * world, total
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"attempt": attempt, "world": world, "torch": torch.__version__}, f)
    del t
    leave_group()


if __name__ == "__main__":
    run_and_exit(main)
