"""2 and 4 real PyTorch processes (torch 1.13 and torch 2.x) rendezvous through ddpstore
exactly as under an agent: init_process_group("gloo", init_method="env://") with
TORCHELASTIC_USE_AGENT_STORE=True, then all_reduce and barrier with checked results."""
import os
import pathlib
import subprocess

import pytest

from store_helpers import Conn, V2, op, store_running

HERE = pathlib.Path(__file__).parent


def run_ranks(python, world, store, tmp_path):
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR=store.host,
                   MASTER_PORT=str(store.port), TORCHELASTIC_USE_AGENT_STORE="True",
                   TORCHELASTIC_RESTART_COUNT="0", GLOO_SOCKET_IFNAME="lo",
                   OMP_NUM_THREADS="1")
        out = open(tmp_path / f"rank{rank}.log", "w+")
        procs.append((subprocess.Popen([python, str(HERE / "gloo_worker.py")], env=env,
                                       stdout=out, stderr=subprocess.STDOUT), out))
    results = []
    for proc, out in procs:
        try:
            rc = proc.wait(timeout=240)
        except subprocess.TimeoutExpired:
            for p, _ in procs:
                p.kill()
            rc = "timeout"
        out.seek(0)
        results.append((rc, out.read()))
    return results


@pytest.mark.parametrize("via_proxy", [False, True], ids=["direct", "proxy"])
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("generation", ["torch1", "torch2"])
def test_gloo_group_over_ddpstore(ddpstore, torch1_python, torch2_python, tmp_path,
                                  generation, world, via_proxy):
    python = torch1_python if generation == "torch1" else torch2_python
    with store_running(ddpstore, tmp_path, via_proxy) as store:
        results = run_ranks(python, world, store, tmp_path)
        for rank, (rc, log) in enumerate(results):
            assert rc == 0, f"rank {rank} exited {rc}:\n{log}"
            assert f"rank {rank}/{world} OK" in log, log
        probe = Conn(store.port, torch2=True)
        probe.send(op(V2, "GETNUMKEYS"))
        assert probe.recv_i64() >= world  # the ranks' addresses and counters are there
        assert "closing" not in store.log(), store.log()
