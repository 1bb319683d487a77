"""What the etcd rendezvous tests share: ddprun's etcd flags, timing a log line, and the
worker scripts (tests/multinode/workers and ./workers). The agents, killing a node's whole
process tree and the waits are tests/lib/jobs.py's."""
import json
import pathlib
import re
import time

from testenv import EXAMPLES, clean_env, free_port, pid_alive  # noqa: F401
from jobs import (Cluster, Proc, all_dead, kill_tree, records, wait_until,  # noqa: F401
                  worker_lookup)

HERE = pathlib.Path(__file__).parent
worker = worker_lookup(HERE.parent / "multinode")  # record.py and the other multi-node workers

# Short timeouts for a loaded 2-core machine; the lease TTL is 1 s x 3 (a vanished host is
# noticed after about 3 s, a killed agent at once).
FAST_CONF = ("join_timeout=60,last_call_timeout=1,close_timeout=10,read_timeout=10,"
             "keep_alive_interval=1,keep_alive_max_attempt=3")


def gloo_loop():
    return str(HERE / "workers" / "gloo_loop.py")


def etcd_flags(endpoint, nnodes, run_id, conf=FAST_CONF, nproc=1, max_restarts=0,
               backend="etcd"):
    return [f"--nnodes={nnodes}", f"--nproc-per-node={nproc}", f"--rdzv-backend={backend}",
            f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}", f"--rdzv-conf={conf}",
            f"--max-restarts={max_restarts}"]


def formed_re(run_id, node_rank, nodes, world=None, again=False):
    """The agent's line for a formed round (c10d's, with 'etcd' and the endpoints)."""
    world_part = rf", world size {world}" if world is not None else ""
    formed = "re-formed" if again else "formed"
    return re.compile(rf"rendezvous round \d+ of job '{re.escape(run_id)}' \(etcd(-v[23])?, "
                      rf"[^)]*\) {formed} in \d+ ms: node rank {node_rank} of {nodes} nodes"
                      rf"{world_part}")


def seconds_until_gone(survivors, timeout=30):
    """Seconds until every survivor has logged that a node "is gone" (polled every 20 ms;
    bounded, and a survivor that exits meanwhile fails at once)."""
    t0 = time.monotonic()
    wait_running(survivors, lambda: all(" is gone" in a.log() for a in survivors),
                 "the survivors to notice the lost node", timeout=timeout)
    return time.monotonic() - t0


def steps_done(d, world=None):
    """Steps rank 0 of the gloo_loop job in d has done (0 before; with world, 0 unless the
    running group has that many workers)."""
    try:
        p = json.loads((pathlib.Path(d) / "progress").read_text())
    except (FileNotFoundError, ValueError):
        return 0
    return p["step"] if world is None or p["world"] == world else 0


def wait_running(agents, predicate, what, timeout=60):
    """wait_until, but an agent of `agents` that exits meanwhile fails the wait at once, with
    its log (a refused flag or a crash should not cost a whole timeout)."""
    def check():
        for a in agents:
            if not a.running():
                raise AssertionError(f"an agent exited with {a.popen.returncode} while waiting "
                                     f"for {what}:\n{a.log()}")
        return predicate()
    try:
        return wait_until(check, what, timeout=timeout)
    except AssertionError as e:  # say what each agent was doing
        logs = "\n".join(f"--- agent {i} ---\n{a.log()[-3000:]}" for i, a in enumerate(agents))
        raise AssertionError(f"{e}\n{logs}") from None
