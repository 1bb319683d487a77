"""Worker for scripts/bench hang (see tests/bench/hang). Modes:

  beat D P      beat every P ms for D s (the documented standard-library way)
  timer D P     torch FileTimer: acquire and release a scope every P ms for D s
  idle D        sleep D s
  stall DIR T   attempt 0: rank 1 beats every 10 ms for 1 s, writes the time of its last beat
                to DIR/last_beat, then stops beating (rank 0 keeps beating); attempt 1: every
                rank writes DIR/started_<rank> at once and exits 0
  expire DIR T  attempt 0: rank 1 opens a FileTimer scope of T s, writes its expiration time
                to DIR/deadline and sleeps; attempt 1: as stall

Every mode but stall/expire writes READY_DIR/<rank> when it starts its loop ($BENCH_READY_DIR).
"""
import os
import socket
import sys
import time

_hb = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
_hb.setblocking(False)


def heartbeat():
    try:
        _hb.sendto(b"", os.environ["DDPRUN_HEARTBEAT_SOCKET"])
    except (OSError, KeyError):
        pass


def ready():
    d = os.environ.get("BENCH_READY_DIR")
    if d:
        with open(os.path.join(d, os.environ["RANK"]), "w") as f:
            f.write(str(time.time()))


def write(path, value):
    with open(path + ".tmp", "w") as f:
        f.write(repr(value))
    os.rename(path + ".tmp", path)


def main():
    mode = sys.argv[1]
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if mode in ("stall", "expire") and attempt > 0:
        write(os.path.join(sys.argv[2], f"started_{rank}"), time.time())
        return
    if mode == "stall":
        out = sys.argv[2]
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            heartbeat()
            time.sleep(0.01)
        if rank == 1:
            heartbeat()
            write(os.path.join(out, "last_beat"), time.time())
            time.sleep(3600)
        while True:
            heartbeat()
            time.sleep(0.01)
    if mode == "expire":
        from torch.distributed.elastic.timer import FileTimerClient, configure, expires
        configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
        after = float(sys.argv[3])
        if rank == 1:
            with expires(after=after):
                write(os.path.join(sys.argv[2], "deadline"), time.time() + after)
                time.sleep(3600)
        time.sleep(3600)
    duration = float(sys.argv[2])
    if mode == "idle":
        ready()
        time.sleep(duration)
        return
    period = float(sys.argv[3]) / 1000
    if mode == "timer":
        from torch.distributed.elastic.timer import FileTimerClient, configure, expires
        configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
    ready()
    end = time.monotonic() + duration
    next_at = time.monotonic()
    while time.monotonic() < end:
        if mode == "beat":
            heartbeat()
        else:
            with expires(after=60):
                pass
        next_at += period
        time.sleep(max(0.0, next_at - time.monotonic()))


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)
