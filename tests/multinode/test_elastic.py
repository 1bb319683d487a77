"""Elastic c10d jobs (--nnodes=MIN:MAX): scale-up restarts the running group without spending a
restart; a worker failure restarts every node with the same TORCHELASTIC_RESTART_COUNT from one
job-wide budget (the first node's --max_restarts); node ranks follow the natural order of the
advertised addresses."""
import json

from mn_helpers import (DDPRUN_ONLY_ENV, c10d_flags, records, store_has, wait_until,
                        worker)


def test_scale_up_from_two_to_three_nodes(cluster, tmp_path, ddpstore):
    _, port = cluster.ddpstore(ddpstore)
    log, go = tmp_path / "log", tmp_path / "go"
    flags = c10d_flags(f"127.0.0.1:{port}", "2:3", "grow", nproc=2, max_restarts=0)
    run = lambda addr: cluster.agent(flags, worker("record.py"), log, "--wait-for", go, addr=addr)
    # node10 sorts after node2 and node9 by natural order, whatever the join order.
    agents = [run("127.0.0.10"), run("127.0.0.9")]
    first = wait_until(lambda: len(records(log)) == 4 and records(log), "the 2-node group")
    assert {r["WORLD_SIZE"] for r in first} == {"4"}
    agents.append(run("127.0.0.2"))
    recs = wait_until(lambda: len(records(log)) == 10 and records(log), "the 3-node group")
    second = recs[4:]
    assert {r["WORLD_SIZE"] for r in second} == {"6"}
    assert {r["GROUP_WORLD_SIZE"] for r in second} == {"3"}
    # Scale-up spends no restart (max_restarts is 0 and the job goes on).
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in recs} == {"0"}
    by_addr = {}
    for r in second:
        by_addr.setdefault(r["GROUP_RANK"], set()).add(r["RANK"])
    assert by_addr == {"0": {"0", "1"}, "1": {"2", "3"}, "2": {"4", "5"}}
    master = {r["MASTER_ADDR"] for r in second}
    assert master == {"127.0.0.2"}  # node rank 0 = the naturally smallest address
    go.touch()
    for a in agents:
        assert a.wait(120) == 0, a.log()
    assert "a new node (127.0.0.2:" in agents[0].log()
    assert "re-forming the worker group without spending a restart" in agents[0].log()


def test_worker_failure_restarts_every_node_with_the_same_count(cluster, tmp_path, ddpstore):
    _, port = cluster.ddpstore(ddpstore)
    log = tmp_path / "log"
    ep = f"127.0.0.1:{port}"
    # Node 1's worker fails on attempts 0 and 1; the job's budget is 2 (the first node's).
    first = cluster.agent(c10d_flags(ep, 2, "retry", max_restarts=2), worker("record.py"), log,
                          "--fail-node", "1", "--fail-attempts", "2", "--exit-code", "7",
                          addr="127.0.0.1")
    wait_until(lambda: store_has(port, "/ddprun/retry/r/0/node/0"), "the first node to join")
    second = cluster.agent(c10d_flags(ep, 2, "retry", max_restarts=9), worker("record.py"), log,
                           "--fail-node", "1", "--fail-attempts", "2", "--exit-code", "7",
                           addr="127.0.0.2")
    assert first.wait(120) == 0, first.log()
    assert second.wait(120) == 0, second.log()
    recs = records(log)
    attempts = sorted((r["TORCHELASTIC_RESTART_COUNT"], r["GROUP_RANK"]) for r in recs)
    assert attempts == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1"), ("2", "0"), ("2", "1")]
    assert {r["TORCHELASTIC_MAX_RESTARTS"] for r in recs} == {"2"}
    assert "restarting the worker group: attempt 2 (2 of 2 restarts used)" in first.log()
    assert "reported a failed worker" in first.log()


def test_exhausted_budget_fails_every_node(cluster, tmp_path, ddpstore):
    _, port = cluster.ddpstore(ddpstore)
    log = tmp_path / "log"
    flags = c10d_flags(f"127.0.0.1:{port}", 2, "doomed", max_restarts=1)
    agents = [cluster.agent(flags, worker("record.py"), log, "--fail-node", "1",
                            "--fail-attempts", "9", "--exit-code", "7", addr=f"127.0.0.{i + 1}")
              for i in range(2)]
    codes = [a.wait(120) for a in agents]
    assert codes == [1, 7], [a.log() for a in agents]  # node 1's root cause exit code
    assert "job failed: node 1 (127.0.0.2) reported a failed worker and no restarts are left" \
        in agents[0].log()
    assert "Root Cause (first observed failure)" in agents[1].log()
    late = cluster.agent(flags, worker("record.py"), tmp_path / "late", addr="127.0.0.3")
    assert late.wait(60) == 1, late.log()
    assert "job 'doomed' is over (failed: no restarts left)" in late.log()


def test_two_c10d_nodes_match_torchrun_2(cluster, torchrun2, torch2_python, tmp_path):
    """The same two-node c10d job under torch 2.x's torchrun and ddprun (each agent with its
    own --local_addr; the agent that binds the endpoint first hosts it): the same variables
    with the same values, but for the ports and the error file's random directory."""
    from mn_helpers import EXAMPLES, Proc, clean_env, free_port
    env = clean_env(python=torch2_python)

    def job(cmd, name):
        out = tmp_path / name
        out.mkdir()
        port = free_port()
        flags = ["--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=c10d",
                 f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=parity",
                 "--rdzv_conf=join_timeout=60"]
        procs = [Proc([*cmd, *flags, f"--local_addr=127.0.0.{i + 1}", "--log_dir",
                       tmp_path / f"{name}_logs{i}", str(EXAMPLES / "env_dump.py"), out],
                      tmp_path / f"{name}{i}.log", env=env) for i in range(2)]
        for p in procs:
            assert p.wait(180) == 0, p.log()
        dumps = [json.loads((out / f"env_{r}.json").read_text())["env"] for r in range(4)]
        return [{k: v for k, v in d.items() if env.get(k) != v} for d in dumps]

    theirs = job(torchrun2, "t2")
    ours = job([cluster.ddprun], "d2")
    for rank in range(4):
        a, b = ours[rank], theirs[rank]
        assert set(a) == set(b) | {"NCCL_ASYNC_ERROR_HANDLING"} | DDPRUN_ONLY_ENV, set(a) ^ set(b)
        for k in b:
            if k in ("MASTER_PORT", "TORCHELASTIC_ERROR_FILE"):
                continue
            assert a[k] == b[k], (rank, k, a[k], b[k])
    assert [o["GROUP_RANK"] for o in ours] == ["0", "0", "1", "1"]


def test_node_rank_hints_are_honoured_by_c10d(cluster, tmp_path, ddpstore):
    _, port = cluster.ddpstore(ddpstore)
    log = tmp_path / "log"
    flags = c10d_flags(f"127.0.0.1:{port}", 3, "hints")
    # 127.0.0.9 asks for node rank 0; the others sort naturally into ranks 1 and 2.
    agents = [cluster.agent([*flags, *hint], worker("record.py"), log, addr=a)
              for a, hint in (("127.0.0.10", []), ("127.0.0.9", ["--node_rank=0"]),
                              ("127.0.0.2", []))]
    for a in agents:
        assert a.wait(120) == 0, a.log()
    recs = records(log)
    assert {r["MASTER_ADDR"] for r in recs} == {"127.0.0.9"}
    ranks = sorted((r["GROUP_RANK"], r["RANK"]) for r in recs)
    assert ranks == [("0", "0"), ("1", "1"), ("2", "2")]
    assert "node rank 0 of 3 nodes" in agents[1].log()
    assert "node rank 1 of 3 nodes" in agents[2].log()
    assert "node rank 2 of 3 nodes" in agents[0].log()
