"""Worker of tests/bench/recovery: a small DDP training job (gloo) that checkpoints, resumes,
and has one rank die on the first attempt.

    recovery_worker.py --timeline FILE --checkpoint DIR [--steps 60] [--fault-step 50]
                       [--checkpoint-every 20] [--memory-every K] [--state-mb MB] [--seed S]

Model: MLP 64-256-256-10, SGD with momentum; every step's batch comes from (seed, step, rank)
alone, so a resumed run sees the same data as an undisturbed one. Rank 0 writes DIR/ckpt.pt
every --checkpoint-every steps (temp file, then os.replace: a reader never sees half a file):
model, optimizer, step, and with --state-mb a float blob of that many MB standing in for the
rest of a real job's state. At start every rank loads the checkpoint, if there is one, and
resumes at its step. With --memory-every K, rank 0 also saves the same state every K steps to
ddprun's in-memory checkpoint (the `ddprun` module, worker-sdk/python), and a restarted worker
restores from there before the file. On attempt 0 (TORCHELASTIC_RESTART_COUNT) rank 1 SIGKILLs itself at the
start of --fault-step.

Timeline: every rank appends one JSON object per line to FILE, {"attempt", "rank", "pid",
"phase", "t"} (t = time.time(); "step" where it applies), each line one write() to a file
opened with O_APPEND, so the lines of concurrent writers never interleave. Phases: script (the
first statement, before torch is imported), imported (torch and what a training script imports
at its top, the model and optimizer built: torch 2.x's optimizers pull in torch._dynamo),
pg_ready, restored (with the step it resumes at), step (after every optimizer step), fault
(rank 1, right before its SIGKILL), done (after the teardown).
"""
import time

T_SCRIPT = time.time()  # the "script" phase: taken before anything else runs

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--timeline", default=os.environ.get("RECOVERY_TIMELINE"))
    p.add_argument("--checkpoint", required=True, help="directory of ckpt.pt")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--fault-step", type=int, default=50)
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--memory-every", type=int, default=0)
    p.add_argument("--state-mb", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--batch", type=int, default=32, help="per rank")
    return p.parse_args()


ARGS = parse_args()
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
RANK = int(os.environ.get("RANK", "0"))
_timeline_fd = (os.open(ARGS.timeline, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                        0o644) if ARGS.timeline else -1)


def mark(phase, t=None, **extra):
    if _timeline_fd < 0:
        return
    rec = {"attempt": ATTEMPT, "rank": RANK, "pid": os.getpid(), "phase": phase,
           "t": time.time() if t is None else t, **extra}
    os.write(_timeline_fd, (json.dumps(rec) + "\n").encode())


mark("script", T_SCRIPT)

# What a typical training script imports at its top.
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

torch.manual_seed(ARGS.seed)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                      nn.Linear(256, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
mark("imported")

dist.init_process_group("gloo", init_method="env://")
mark("pg_ready")

ckpt_file = os.path.join(ARGS.checkpoint, "ckpt.pt")
blob = None  # the --state-mb stand-in; only rank 0, which writes checkpoints, keeps one
start = 0
saved = None
if ARGS.memory_every > 0:
    import ddprun
    saved = ddprun.load_checkpoint("bench", weights_only=False)
if saved is None and os.path.exists(ckpt_file):
    saved = torch.load(ckpt_file, map_location="cpu", weights_only=False)
if saved is not None:
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    start = saved["step"]
    blob = saved["blob"] if RANK == 0 else None
    del saved
elif RANK == 0 and ARGS.state_mb > 0:
    blob = torch.zeros(ARGS.state_mb * (1 << 20) // 4)
mark("restored", step=start)

ddp = DistributedDataParallel(model)


def batch(step):
    g = torch.Generator().manual_seed(ARGS.seed * 1_000_003 + step * 64 + RANK)
    return torch.randn(ARGS.batch, 64, generator=g), torch.randint(0, 10, (ARGS.batch,),
                                                                   generator=g)


def save_checkpoint(step):
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
             "blob": blob}
    tmp = ckpt_file + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, ckpt_file)


last = start
for step in range(start, ARGS.steps):
    if ATTEMPT == 0 and RANK == ARGS.fault_rank and step == ARGS.fault_step:
        mark("fault", step=step)
        os.kill(os.getpid(), signal.SIGKILL)
    x, y = batch(step)
    optimizer.zero_grad()
    F.cross_entropy(ddp(x), y).backward()
    optimizer.step()
    last = done = step + 1
    mark("step", step=done)
    if RANK == 0 and done % ARGS.checkpoint_every == 0 and done < ARGS.steps:
        save_checkpoint(done)
    if RANK == 0 and ARGS.memory_every > 0 and done % ARGS.memory_every == 0:
        ddprun.save_checkpoint({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                "step": done, "blob": blob}, "bench")

# Teardown that stays clear of torch's exit-time troubles with gloo: drop the objects whose
# tensors gloo's threads might still be freeing, meet at a barrier so those threads are idle,
# destroy the group, and leave without interpreter finalisation.
del ddp, optimizer, model, blob
gc.collect()
dist.barrier()
dist.destroy_process_group()
mark("done", step=last)
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
