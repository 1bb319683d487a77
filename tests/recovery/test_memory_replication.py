"""In-memory checkpoints outlive a node (agent/checkpoint_replicas.hpp): two agents as two
nodes (a ddpstore as the rendezvous endpoint), real torch 2.x gloo workers that each save their
own state to memory. Each node's save is pushed to the other node; the second node is then
killed whole (agent, workers, its memory directory), a replacement node joins, restores the
dead node's state from the survivor's replica without any file, and the job ends with the
parameters of a run that lost nothing. The nodes are loopback addresses of this machine, and
then separate hosts (a network namespace each, the replacement on a host of its own; needs root
and `ip netns`)."""
import json
import pathlib
import re
import signal

import pytest

from jobs import c10d_flags, records, wait_until
from netns_hosts import node_places
from testenv import TORCH2_PYTHON, clean_env

TRAIN = pathlib.Path(__file__).parent / "replica_train.py"
MODULE = pathlib.Path(__file__).parents[2] / "worker-sdk" / "python"


def env(**extra):
    return clean_env(python=TORCH2_PYTHON, PYTHONPATH=MODULE, OMP_NUM_THREADS="1", **extra)


@pytest.fixture(params=["loopback", "netns"])
def where(request):
    """Node i's place (the replacement is node 2: a host of its own)."""
    places = node_places(request.param, 3, prefix="rep", net=214)
    yield places
    places.close()


def start(cluster, where, ddpstore_port, job, d, node):
    flags = c10d_flags(f"{where.store}:{ddpstore_port}", "2", job)
    addr, netns = where.node(node)
    # Warm start on (the default for elastic jobs): a replacement node's worker is forked too.
    return cluster.agent(flags, TRAIN, d, addr=addr, netns=netns, env=env(**where.env),
                         warm_start=True)


def final_params(d):
    return [json.loads((d / f"final_{r}.json").read_text()) for r in (0, 1)]


def test_a_replacement_node_restores_the_dead_nodes_state_from_its_peer(cluster, ddpstore,
                                                                       tmp_path, where):
    _, port = cluster.ddpstore(ddpstore, host=where.store, netns=where.store_netns)
    whole, lost = tmp_path / "whole", tmp_path / "lost"
    whole.mkdir()
    lost.mkdir()

    # The run that loses nothing.
    agents = [start(cluster, where, port, "replica-whole", whole, n) for n in (0, 1)]
    wait_until(lambda: all((whole / f"saved_{r}").exists() for r in (0, 1)), "the saves", 180)
    (whole / "go").touch()
    for a in agents:
        assert a.wait(180) == 0, a.log()

    # The run that loses node 1 right after the saves have reached the other node.
    a = start(cluster, where, port, "replica-lost", lost, 0)
    b = start(cluster, where, port, "replica-lost", lost, 1)
    wait_until(lambda: all((lost / f"saved_{r}").exists() for r in (0, 1)), "the saves", 180)
    dirs = {s["rank"]: pathlib.Path(s["dir"]) for s in records(lost / "starts.jsonl")}
    wait_until(lambda: (dirs[0] / ".replicas" / "1" / "rank1.pt").exists()
               and (dirs[1] / ".replicas" / "0" / "rank0.pt").exists(),
               "each node's save on the other node", 60)
    b.kill(signal.SIGKILL)
    wait_until(lambda: not dirs[1].exists(), "the dead node's memory to go", 30)
    replacement = start(cluster, where, port, "replica-lost", lost, 2)  # a node of its own
    assert a.wait(240) == 0, a.log()
    assert replacement.wait(240) == 0, replacement.log()

    log = replacement.log()
    survivor = re.escape(where.node(0)[0])
    assert re.search(r"memory checkpoints: node rank 1's state \(1 file\(s\), saved in round 0\) "
                     rf"restored from node 0 \({survivor}\) in [\d.]+ s", log), log
    assert "restored" not in a.log(), a.log()  # the survivor kept its own state
    starts = records(lost / "starts.jsonl")
    assert [(s["rank"], s["start"]) for s in starts[2:]] in ([(0, 10), (1, 10)],
                                                             [(1, 10), (0, 10)]), starts
    assert final_params(lost) == final_params(whole)
    assert not dirs[0].exists()  # the job's memory went with it, replicas included
