"""A long-running worker for signal and orphan tests (no torch needed).

    signal_worker.py DIR [--on-term exit|ignore] [--grandchildren N]

Starts N grandchildren (sleeping subprocesses in its process group) and records every pid in
DIR/pids_<rank>, installs a SIGTERM handler (exit: write DIR/term_<rank> and exit 0;
ignore: SIG_IGN), writes DIR/ready_<rank>, then waits for signals forever.
"""
import argparse
import os
import signal
import subprocess
import sys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--on-term", choices=["exit", "ignore"], default="exit")
    parser.add_argument("--grandchildren", type=int, default=0)
    args = parser.parse_args()
    rank = os.environ["RANK"]

    def on_term(signum, frame):
        with open(os.path.join(args.dir, f"term_{rank}"), "w") as f:
            f.write(f"{signum}\n")
        sys.exit(0)

    if args.on_term == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, on_term)

    children = [subprocess.Popen(["sleep", "1000"]) for _ in range(args.grandchildren)]
    with open(os.path.join(args.dir, f"pids_{rank}"), "w") as f:
        f.write(" ".join(str(p) for p in [os.getpid()] + [c.pid for c in children]))
    with open(os.path.join(args.dir, f"ready_{rank}"), "w") as f:
        f.write("ready\n")
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
