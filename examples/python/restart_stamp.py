"""Restart-latency probe for tests/bench/launch (no torch needed).

    restart_stamp.py FILE

Appends "<attempt> <rank> <CLOCK_REALTIME seconds>" to FILE as its very first action; on
attempt 0 the worker of rank 0 then exits 1, so the agent restarts the group. The time from
that line to the first line of attempt 1 is the restart latency.
"""
import os
import sys
import time

now = time.time()
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
rank = os.environ["RANK"]
with open(sys.argv[1], "a") as f:
    f.write(f"{attempt} {rank} {now:.6f}\n")
if attempt == "0" and rank == "0":
    sys.exit(1)
