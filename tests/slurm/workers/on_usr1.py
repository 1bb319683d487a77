"""Test worker for preemption: writes OUT/ready_<LOCAL_RANK>, waits for SIGUSR1 (the signal
Slurm sends before a time limit with --signal=USR1@SECONDS), then writes OUT/usr1_<LOCAL_RANK>
(where a real job saves its checkpoint) and exits 0. Gives up after 120 s.

    on_usr1.py OUT
"""
import os
import signal
import sys

out, local_rank = sys.argv[1], os.environ["LOCAL_RANK"]
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
open(os.path.join(out, f"ready_{local_rank}"), "w").close()
got = signal.sigtimedwait({signal.SIGUSR1}, 120)
if got is None:
    sys.exit(3)
with open(os.path.join(out, f"usr1_{local_rank}"), "w") as f:
    f.write(f"{os.getpid()}\n")
sys.exit(0)
