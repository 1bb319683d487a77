"""Writes this worker's environment and argv to <dir>/env_<RANK>.json (no torch needed).

Used to compare the environment ddprun gives its workers with torchrun's:
    ddprun --standalone --nproc_per_node=2 examples/python/env_dump.py /tmp/out
"""
import json
import os
import sys

out_dir = sys.argv[1] if len(sys.argv) > 1 else "."
with open(os.path.join(out_dir, f"env_{os.environ['RANK']}.json"), "w") as f:
    json.dump({"env": dict(os.environ), "argv": sys.argv, "pid": os.getpid(),
               "pgid": os.getpgid(0), "sid": os.getsid(0)}, f)
