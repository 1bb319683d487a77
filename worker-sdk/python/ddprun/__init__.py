"""ddprun's helpers for Python workers: in-memory checkpoints, heartbeats, the flight recorder.

Pure Python, for any torch >= 1.13. Every function is harmless outside ddprun (under torchrun,
or with no launcher at all): a heartbeat goes nowhere, a memory save returns False, a memory
load returns None, so a script that uses them runs unchanged anywhere.

    import ddprun
    state = ddprun.load_checkpoint()              # after a restart: the last save, from memory
    if state is None and os.path.exists(path):    # not in memory (first start, a new node)
        state = torch.load(path, map_location="cpu")
    ...
    for step in ...:
        ...
        ddprun.save_checkpoint({"model": model.state_dict(), "optim": opt.state_dict(),
                                "step": step + 1})  # every step: a memory copy, no disk write
        ddprun.heartbeat()
"""
from ddprun.checkpoint import (CheckpointLimitError, load_checkpoint, memory_checkpoint_dir,
                               save_checkpoint)
from ddprun.flight_recorder import serve_flight_recorder
from ddprun.heartbeat import heartbeat

__all__ = ["CheckpointLimitError", "heartbeat", "load_checkpoint", "memory_checkpoint_dir",
           "save_checkpoint", "serve_flight_recorder"]
