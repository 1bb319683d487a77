"""A worker using torch's FileTimer client, as torchrun documents it.

    timer_worker.py OUT_DIR

Every rank configures FileTimerClient on $TORCHELASTIC_TIMER_FILE. On attempt 0 rank 1 runs
time.sleep(60) inside `expires(after=1, scope="stuck_batch")`, so the launcher must deliver the
scope's signal (SIGKILL); otherwise rank 1 runs a short scope and writes
OUT_DIR/rank1_done_<attempt>. Rank 0 waits (inside no scope) for that file, up to 120 s, and
writes OUT_DIR/result_<attempt>.json.
"""
import json
import os
import sys
import time

import torch
from torch.distributed.elastic.timer import FileTimerClient, configure, expires


def main():
    out = sys.argv[1]
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    with open(os.path.join(out, "starts.jsonl"), "a") as f:
        f.write(json.dumps({"rank": rank, "attempt": attempt, "pid": os.getpid(),
                            "timer_file": os.environ.get("TORCHELASTIC_TIMER_FILE")}) + "\n")
    configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
    if rank == 1:
        if attempt == 0:
            with expires(after=1, scope="stuck_batch"):
                time.sleep(60)
        with expires(after=30, scope="quick_batch"):
            time.sleep(0.1)
        open(os.path.join(out, f"rank1_done_{attempt}"), "w").close()
    else:
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(out, f"rank1_done_{attempt}")):
            assert time.monotonic() < deadline, "rank 1 never finished"
            time.sleep(0.05)
        with open(os.path.join(out, f"result_{attempt}.json"), "w") as f:
            json.dump({"attempt": attempt, "torch": torch.__version__}, f)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
