"""scripts/bench diagnose's worker: tests/hang/workers/skip_collective.py (rank 1 skips an
all_reduce), plus one thing for the peer measurement only: when ddprun asks for the flight
recorders (its request file appears), this worker also leaves torch's own pickle dump in
BENCH_PICKLE_DIR/pickle_<rank>, the input torch's analyzer (fr_trace) reads."""
import os
import pathlib
import runpy
import sys
import threading
import time

WORKERS = pathlib.Path(__file__).resolve().parents[1] / "hang" / "workers"


def leave_pickle():
    request = os.path.join(os.environ["DDPRUN_FLIGHT_RECORDER"], "request")
    out = pathlib.Path(os.environ["BENCH_PICKLE_DIR"])
    while not os.path.exists(request):
        time.sleep(0.05)
    import torch._C._distributed_c10d as c10d
    tmp = out / f".pickle_{os.environ['RANK']}"
    tmp.write_bytes(c10d._dump_fr_trace())
    tmp.rename(out / f"pickle_{os.environ['RANK']}")


threading.Thread(target=leave_pickle, daemon=True).start()
sys.path.insert(0, str(WORKERS))
script = str(WORKERS / "skip_collective.py")
sys.argv = [script] + sys.argv[1:]
runpy.run_path(script, run_name="__main__")
