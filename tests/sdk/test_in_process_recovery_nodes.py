"""In-process recovery across nodes (ddprun --in-process-recovery, ddprun::TrainingLoop): two
agents as two nodes (a ddpstore as the rendezvous endpoint), C++ SDK workers. A rank SIGKILLed in
the middle of a step is started again alone by its node's agent; every other worker, on both
nodes, keeps its process and rebuilds the process group with it, the other node's agent
following the recovery it learns of through the rendezvous store. The job ends in the round it
started in, with the parameters, bitwise, of a run of the same shape that never failed. The
nodes are loopback addresses of this machine, and then separate hosts (a network namespace
each; needs root and `ip netns`)."""
import re

import pytest

from jobs import c10d_flags
from netns_hosts import node_places
from sdkutil import LAUNCHER, sdk_bin
from testenv import clean_env

STEPS = 30


@pytest.fixture(params=["loopback", "netns"])
def where(request):
    if LAUNCHER != "ddprun":
        pytest.skip("in-process recovery is ddprun's")
    places = node_places(request.param, 2, prefix="ipr", net=215)
    yield places
    places.close()


def job(cluster, where, port, name, nproc, args):
    """Two agents of job `name`; returns them once both exited 0, with their logs."""
    flags = c10d_flags(f"{where.store}:{port}", "2", name, nproc=nproc, max_restarts=2)
    agents = []
    for node in (0, 1):
        addr, netns = where.node(node)
        agents.append(cluster.agent(
            [*flags, "--in-process-recovery", "--no_python"], sdk_bin("recovery_tool"),
            "--steps", str(STEPS), "--step-ms", "50", *args, addr=addr, netns=netns,
            env=clean_env(OMP_NUM_THREADS="1", **where.env)))
    for a in agents:
        assert a.wait(240) == 0, a.log()
    return [a.log() for a in agents]


def ranks(logs):
    """rank -> {"start_pids": [...], "end_pid", "hash", "recoveries"} from both nodes' output."""
    found = {}
    for log in logs:
        for rank, pid, _ in re.findall(r"rank (\d+) pid (\d+) generation (\d+) start", log):
            found.setdefault(int(rank), {"start_pids": []})["start_pids"].append(int(pid))
        for rank, pid, digest, rec in re.findall(
                r"rank (\d+) pid (\d+) params (\w+) recoveries (\d+)", log):
            found[int(rank)].update(end_pid=int(pid), hash=digest, recoveries=int(rec))
    return found


@pytest.mark.parametrize("nproc,killed", [(1, 1), (2, 0)])
def test_a_rank_killed_on_one_node_is_replaced_and_every_other_rank_keeps_its_process(
        cluster, ddpstore, where, nproc, killed):
    _, port = cluster.ddpstore(ddpstore, host=where.store, netns=where.store_netns)
    whole = ranks(job(cluster, where, port, f"ipr-whole-{nproc}", nproc, []))
    assert len(whole) == 2 * nproc and len({r["hash"] for r in whole.values()}) == 1, whole

    logs = job(cluster, where, port, f"ipr-lost-{nproc}", nproc, ["--kill", f"{killed}:12"])
    found = ranks(logs)
    everything = "\n".join(logs)
    assert sorted(found) == list(range(2 * nproc)), everything
    for rank, r in found.items():
        assert r["hash"] == whole[0]["hash"], (rank, found, whole)
        assert r["recoveries"] == 1, found
        if rank == killed:  # the first process died, its replacement finished
            assert len(r["start_pids"]) == 2 and r["end_pid"] == r["start_pids"][1], found
        else:  # one process from start to end, on either node
            assert r["start_pids"] == [r["end_pid"]], found

    # The killed rank's node replaced it; the other node followed; both came back to HEALTHY in
    # the round they started in, the restart spent counted once.
    replaced = [log for log in logs if "on worker-replaceable: replace" in log]
    followed = [log for log in logs if "on peer-recovering: follow" in log]
    assert len(replaced) == 1 and len(followed) == 1, everything
    assert re.search(rf"in-process recovery: rank {killed} \(pid \d+\) replaced by pid \d+",
                     replaced[0]), replaced[0]
    assert re.search(r"in-process recovery: node \d \(\S+\) replaces its failed worker\(s\); "
                     r"this node's workers rebuild their process group to generation 1",
                     followed[0]), followed[0]
    for log in logs:
        assert "RECOVERING -> HEALTHY on recovered: resume" in log, log
        assert "restart count 1 of 2" in log, log
        assert "re-formed" not in log and "INIT on" not in log, log


def test_a_second_failure_during_the_recovery_restarts_every_node(cluster, ddpstore, where):
    # The replacement dies before it joins: its node ends the round, both nodes restart their
    # groups (the recovery spent restart 1, this restart 2), and train from the start to the
    # parameters of a run that never failed.
    _, port = cluster.ddpstore(ddpstore, host=where.store, netns=where.store_netns)
    whole = ranks(job(cluster, where, port, "ipr-whole-2nd", 1, []))
    logs = job(cluster, where, port, "ipr-second", 1, ["--kill", "1:12", "--kill-replacement", "1"])
    everything = "\n".join(logs)
    for r in ranks(logs).values():
        assert r["hash"] == whole[0]["hash"], everything
    assert sum("on worker-replaceable: replace" in log for log in logs) == 1, everything
    assert sum("on peer-recovering: follow" in log for log in logs) == 1, everything
    assert sum(bool(re.search(r"-> INIT on worker-failed: restart", log))
               for log in logs) == 1, everything
    assert sum(bool(re.search(r"RECOVERING -> INIT on peer-failed: restart", log))
               for log in logs) == 1, everything
    for log in logs:
        assert re.search(r"rendezvous round 1 .* re-formed .* restart count 2 of 2", log), log


def test_a_node_whose_workers_run_no_training_loop_makes_it_a_group_restart(cluster, ddpstore,
                                                                             where):
    # Workers with a loop of their own never announce one; the node whose worker dies has no
    # other worker to ask, so it is the rendezvous that says the other node cannot rebuild.
    _, port = cluster.ddpstore(ddpstore, host=where.store, netns=where.store_netns)
    logs = job(cluster, where, port, "ipr-plain", 1, ["--kill", "1:12", "--plain", "1"])
    everything = "\n".join(logs)
    assert "RECOVERING" not in everything, everything
    assert sum("in-process recovery: the workers of 2 of 2 nodes do not all run a "
               "ddprun::TrainingLoop of process group generation 0: restarting the worker group"
               in log for log in logs) == 1, everything
    for log in logs:
        assert re.search(r"rendezvous round 1 .* re-formed .* restart count 1 of 2", log), log
