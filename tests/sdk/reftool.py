"""What the Python twins of the SDK's C++ test tools share (tool_util.hpp is the C++ side)."""
import gc
import os
import sys

import torch
import torch.distributed as dist


def init_deterministic(module):
    """Weights from a formula, not an RNG: the same as tool_util.hpp's init_deterministic."""
    with torch.no_grad():
        for k, p in enumerate(module.parameters()):
            t = torch.arange(p.numel()).to(torch.float)
            p.copy_((torch.sin(t * 0.7 + k) * 0.3).reshape(p.shape))


def tear_down():
    """Leaves the group as examples/python/ddp_gloo.py does: the caller has dropped its DDP,
    optimizer and hook state; collect them, then meet and destroy the group, so torch 1.13's
    Gloo cannot deadlock in its destructor at interpreter exit."""
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def run(main):
    """Runs main(), then exits at once: torch 2.x can abort in a process group's destructor at
    interpreter exit."""
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
