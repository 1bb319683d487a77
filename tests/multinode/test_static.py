"""Static multi-node jobs (--nnodes=N --node_rank=i --master_addr --master_port): real ddprun
agents on loopback, each with its own --local_addr, running real PyTorch workers; the worker
environment equals torchrun 1.13's for the same two-node job; an unreachable or busy master
gives a clear error instead of a hang."""
import json
import os
import re
import socket

from mn_helpers import (DDPRUN_ONLY_ENV, EXAMPLES, TORCH1_PYTHON, Proc, clean_env,
                        free_port, worker)

ONLY_TORCH2 = {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCHELASTIC_SIGNALS_TO_HANDLE"} | DDPRUN_ONLY_ENV


def static_flags(port, rank, nproc=2, nnodes=2, extra=()):
    return [f"--nnodes={nnodes}", f"--node_rank={rank}", f"--nproc_per_node={nproc}",
            "--master_addr=127.0.0.1", f"--master_port={port}", *extra]


def env_dumps(out_dir, world):
    dumps = {}
    for rank in range(world):
        d = json.loads((out_dir / f"env_{rank}.json").read_text())
        dumps[rank] = d
    return dumps


def test_two_static_nodes_match_torchrun_1_13(cluster, torchrun1, tmp_path):
    env = clean_env(python=TORCH1_PYTHON)
    tee = ["--redirects", "1", "--tee", "1"]

    # torchrun 1.13: two agents on this machine, node 0 hosts the store at the master port.
    theirs_dir = tmp_path / "theirs"
    theirs_dir.mkdir()
    port = free_port()
    theirs = [Proc([*torchrun1, *static_flags(port, r), *tee, "--log_dir", tmp_path / f"tl{r}",
                    str(EXAMPLES / "env_dump.py"), theirs_dir], tmp_path / f"torchrun{r}.log",
                   env=env) for r in (1, 0)]
    for p in theirs:
        assert p.wait(180) == 0, p.log()

    ours_dir = tmp_path / "ours"
    ours_dir.mkdir()
    port = free_port()
    ours = [cluster.agent([*static_flags(port, r), *tee], str(EXAMPLES / "env_dump.py"), ours_dir,
                          addr=f"127.0.0.{r + 1}") for r in (1, 0)]
    for p in ours:
        assert p.wait(120) == 0, p.log()

    a, b = env_dumps(ours_dir, 4), env_dumps(theirs_dir, 4)
    for rank in range(4):
        added_a = {k: v for k, v in a[rank]["env"].items() if env.get(k) != v}
        added_b = {k: v for k, v in b[rank]["env"].items() if env.get(k) != v}
        assert set(added_a) == set(added_b) | ONLY_TORCH2, set(added_a) ^ set(added_b)
        for k in added_b:
            if k == "MASTER_PORT":
                # torchrun 1.13 gives workers the rendezvous store itself; ddprun a fresh
                # store per round on the node-rank-0 agent (as torchrun 2.x's c10d does).
                assert int(added_a[k]) > 0
            elif k == "TORCHELASTIC_ERROR_FILE":
                assert added_a[k].endswith(f"/attempt_0/{added_a['LOCAL_RANK']}/error.json")
            else:
                assert added_a[k] == added_b[k], (rank, k, added_a[k], added_b[k])
    # Ranks follow the node rank: node 1's workers are RANK 2 and 3.
    assert [a[r]["env"]["GROUP_RANK"] for r in range(4)] == ["0", "0", "1", "1"]
    assert len({a[r]["env"]["MASTER_PORT"] for r in range(4)}) == 1
    assert "rendezvous round 0 of job 'none' (static, 127.0.0.1:" in ours[1].log()
    assert "hosting the rendezvous store" in ours[1].log()  # node 0 hosts


def test_static_gloo_job_across_two_nodes(cluster, tmp_path):
    port = free_port()
    out = tmp_path / "result.json"
    nodes = [cluster.agent(static_flags(port, r, nproc=1), str(EXAMPLES / "ddp_gloo.py"),
                           "--out", out, addr=f"127.0.0.{r + 1}") for r in (0, 1)]
    for p in nodes:
        assert p.wait(180) == 0, p.log()
    result = json.loads(out.read_text())
    assert result["world_size"] == 2
    assert result["rank_sum"] == 3.0
    assert [g["rank"] for g in result["gathered"]] == [0, 1]


def test_unreachable_master_fails_after_join_timeout_naming_it(cluster, tmp_path):
    port = free_port()
    node1 = cluster.agent(static_flags(port, 1, nproc=1, extra=["--rdzv_conf=timeout=1"]),
                          worker("record.py"), tmp_path / "log")
    assert node1.wait(60) == 1, node1.log()
    assert re.search(rf"error: cannot reach the rendezvous store at 127\.0\.0\.1:{port} within "
                     r"1 s \(timeout\)", node1.log()), node1.log()
    assert not (tmp_path / "log").exists()  # no worker started


def test_busy_master_port_is_an_error_naming_the_port(cluster, tmp_path):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        node0 = cluster.agent(static_flags(port, 0, nproc=1, extra=["--rdzv_conf=timeout=5"]),
                              worker("record.py"), tmp_path / "log")
        assert node0.wait(60) == 1, node0.log()
    assert "cannot host the rendezvous store" in node0.log()
    assert f"is another job using --master-port {port}? Choose another one" in node0.log()
    # The holder is this test's own process (pytest), named with its pid and command line.
    assert re.search(rf"\(port {port} is held by pid {os.getpid()}: \S*python\S* .*pytest",
                     node0.log()), node0.log()
