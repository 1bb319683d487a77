"""Test worker (no torch): appends one JSON line describing itself to a file, then optionally
waits for a file to appear, or fails on purpose.

    record.py LOG [--wait-for FILE] [--fail-node G --fail-attempts K] [--exit-code C]

The line holds the torchrun variables a multi-node test checks (ranks, sizes, master, restart
count) and the worker's pid. --fail-node G makes the workers of group rank G exit with C
(default 3) while TORCHELASTIC_RESTART_COUNT < K.
"""
import argparse
import json
import os
import sys
import time

KEYS = ["RANK", "LOCAL_RANK", "GROUP_RANK", "GROUP_WORLD_SIZE", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
        "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE"]

parser = argparse.ArgumentParser()
parser.add_argument("log")
parser.add_argument("--wait-for")
parser.add_argument("--fail-node", type=int, default=-1)
parser.add_argument("--fail-attempts", type=int, default=0)
parser.add_argument("--exit-code", type=int, default=3)
args = parser.parse_args()

entry = {k: os.environ.get(k) for k in KEYS}
entry["pid"] = os.getpid()
with open(args.log, "a") as f:
    f.write(json.dumps(entry) + "\n")
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if int(os.environ["GROUP_RANK"]) == args.fail_node and restart < args.fail_attempts:
    time.sleep(0.2)
    sys.exit(args.exit_code)
if args.wait_for:
    while not os.path.exists(args.wait_for):  # a test worker: a file is its only signal
        time.sleep(0.02)
