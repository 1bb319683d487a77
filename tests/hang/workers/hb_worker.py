"""Test worker for ddprun's hang detection (standard library only, no torch).

    hb_worker.py LOG [--beats N] [--interval S] [--no-beat] [--silent-rank R] [--run-for S]
                     [--wait-for FILE]
                     [--hang-rank R] [--hang-attempts K] [--how stop|block|sleep]
                     [--hang-when FILE] [--ignore-term] [--linger-rank R --linger S]

Appends a JSON line to LOG when it starts ({"event": "start", rank, local_rank, group_rank,
attempt, pid, and the hang variables it got}) and when it finishes ("done"). It beats N times
(every S seconds; --no-beat: never, --silent-rank R: the worker of rank R never), then:
  - the worker of global rank R, while TORCHELASTIC_RESTART_COUNT < K, hangs (after FILE
    appears, with --hang-when, beating meanwhile): `stop` SIGSTOPs itself, `block` waits on an
    Event forever, `sleep` sleeps 600 s; none of them beats again;
  - the others work for --run-for seconds and, with --wait-for, until FILE appears, beating
    every S seconds; then the worker of rank --linger-rank sleeps --linger seconds without
    beating (a worker that "finished" but does not exit), and every worker exits 0.
--ignore-term ignores SIGTERM (a worker that only SIGKILL stops).
"""
import argparse
import json
import os
import signal
import sys
import threading
import time

from beat import heartbeat  # the documented snippet, shared by the test workers


def record(path, event, **fields):
    entry = {"event": event, "rank": int(os.environ["RANK"]),
             "local_rank": int(os.environ["LOCAL_RANK"]),
             "group_rank": int(os.environ["GROUP_RANK"]),
             "attempt": int(os.environ["TORCHELASTIC_RESTART_COUNT"]), "pid": os.getpid(),
             **fields}
    with open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")


def hang(how):
    if how == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        threading.Event().wait()  # continued by someone: still hung
    elif how == "block":
        threading.Event().wait()
    else:
        time.sleep(600)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("log")
    p.add_argument("--beats", type=int, default=3)
    p.add_argument("--interval", type=float, default=0.05)
    p.add_argument("--no-beat", action="store_true")
    p.add_argument("--silent-rank", type=int, default=-1)
    p.add_argument("--run-for", type=float, default=0.0)
    p.add_argument("--wait-for")
    p.add_argument("--hang-rank", type=int, default=-1)
    p.add_argument("--hang-attempts", type=int, default=1)
    p.add_argument("--how", choices=["stop", "block", "sleep"], default="stop")
    p.add_argument("--hang-when")
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--linger-rank", type=int, default=-1)
    p.add_argument("--linger", type=float, default=0.0)
    args = p.parse_args()

    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    record(args.log, "start", hb_socket=os.environ.get("DDPRUN_HEARTBEAT_SOCKET"),
           timer_file=os.environ.get("TORCHELASTIC_TIMER_FILE"))
    silent = args.no_beat or rank == args.silent_rank
    beat = (lambda: None) if silent else heartbeat

    for _ in range(args.beats):
        beat()
        time.sleep(args.interval)
    if rank == args.hang_rank and attempt < args.hang_attempts:
        if args.hang_when:
            while not os.path.exists(args.hang_when):  # a test worker: a file is its only signal
                beat()
                time.sleep(args.interval)
        record(args.log, "hanging", how=args.how)
        hang(args.how)

    deadline = time.monotonic() + args.run_for
    while time.monotonic() < deadline or (args.wait_for and not os.path.exists(args.wait_for)):
        beat()
        time.sleep(args.interval)
    if rank == args.linger_rank:
        record(args.log, "lingering")
        time.sleep(args.linger)
    record(args.log, "done")


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
