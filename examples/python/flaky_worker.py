"""A worker that fails on purpose, for restart and failure-summary tests (no torch needed
unless --record is given).

    flaky_worker.py LOG_FILE [--fail-rank R] [--fail-attempts N] [--mode exit|raise|kill]
                             [--exit-code C] [--record]

Prints "worker rank <rank> attempt <attempt>", appends "<attempt> <rank> <pid> <time>" to
LOG_FILE, then the worker of rank R fails (once every rank of the attempt has logged) while
TORCHELASTIC_RESTART_COUNT < N: by exiting with C (exit), by an uncaught exception
(raise; with --record through PyTorch's @record, which writes TORCHELASTIC_ERROR_FILE), or by
SIGKILLing itself (kill). Other ranks exit 0 (or wait for SIGTERM with --others-wait).
"""
import argparse
import os
import signal
import sys
import time


def wait_for_peers(log, attempt):
    """Fails only once every rank of this attempt has started (and logged), so tests see a
    deterministic set of workers. There is no event to wait on: poll the shared log."""
    world = int(os.environ["WORLD_SIZE"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with open(log) as f:
            if sum(line.split()[0] == str(attempt) for line in f) >= world:
                return
        time.sleep(0.005)


def run(args):
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rank = int(os.environ["RANK"])
    print(f"worker rank {rank} attempt {attempt}", flush=True)
    with open(args.log, "a") as f:
        f.write(f"{attempt} {rank} {os.getpid()} {time.time():.6f}\n")
    if rank == args.fail_rank and attempt < args.fail_attempts:
        wait_for_peers(args.log, attempt)
        if args.mode == "exit":
            print(f"rank {rank} failing with exit code {args.exit_code}", file=sys.stderr)
            sys.exit(args.exit_code)
        if args.mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"planned failure of rank {rank} on attempt {attempt}")
    if args.others_wait and rank != args.fail_rank:
        signal.pause()  # until the agent stops us


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("log")
    parser.add_argument("--fail-rank", type=int, default=1)
    parser.add_argument("--fail-attempts", type=int, default=1)
    parser.add_argument("--mode", choices=["exit", "raise", "kill"], default="exit")
    parser.add_argument("--exit-code", type=int, default=3)
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--others-wait", action="store_true")
    args = parser.parse_args()
    if args.record:
        from torch.distributed.elastic.multiprocessing.errors import record
        record(run)(args)
    else:
        run(args)


if __name__ == "__main__":
    main()
