"""A node's death: SIGKILL of one agent of three (MIN=2) — the first one, whose node is node
rank 0 and hosts the workers' store — while a real job runs, with a ddpstore endpoint so the
rendezvous store does not die with any node. The survivors notice at once (the agent's last
will), stop their workers, re-form as two nodes without spending a restart, and finish the
job from its checkpoint: a PyTorch gloo job, and the C++ `train` example."""
import json
import os
import re
import signal

import pytest

from mn_helpers import (SOURCE_DIR, all_dead, c10d_flags, records, wait_until,
                        worker)

SDK_BIN_DIR = os.environ.get("DDPRUN_SDK_BIN_DIR",
                             os.environ.get("DDPRUN_BIN_DIR", str(SOURCE_DIR / "build" / "bin")))


def three_nodes(cluster, ddpstore, job, entry, *args, no_python=False, store_proxy="off"):
    _, port = cluster.ddpstore(ddpstore)
    flags = c10d_flags(f"127.0.0.1:{port}", "2:3", job) + ["--store-proxy", store_proxy]
    if no_python:
        flags.append("--no_python")
    # 127.0.0.2 sorts first: the first agent is node rank 0 and hosts the workers' store.
    return [cluster.agent(flags, entry, *args, addr=f"127.0.0.{i + 2}") for i in range(3)]


def check_survivors(agents):
    for a in agents[1:]:
        assert a.wait(240) == 0, a.log()
        log = a.log()
        assert re.search(r"round 0: node 0 \(127\.0\.0\.2\) is gone \(its connection to the store "
                         r"closed\): stopping", log), log
        assert "re-forming the worker group without spending a restart" in log
        assert re.search(r"rendezvous round 1 of job '\S+' \(c10d, \S+\) re-formed in \d+ ms: "
                         r"node rank \d of 2 nodes", log), log


@pytest.mark.parametrize("store_proxy", ["off", "on"])
def test_survivors_finish_a_gloo_job(cluster, tmp_path, ddpstore, store_proxy):
    # With the store proxy, the survivors' proxies lose the dead node's store with it and each
    # agent makes a new one for round 1.
    d = tmp_path / "job"
    d.mkdir()
    agents = three_nodes(cluster, ddpstore, "gloo-death", worker("elastic_gloo.py"),
                         "--dir", d, "--steps", "80", "--every", "5", "--delay", "0.05",
                         store_proxy=store_proxy)
    wait_until(lambda: (d / "progress").exists() and int((d / "progress").read_text()) >= 10,
               "a checkpoint at step 10", timeout=120)
    first = records(d / "pids.jsonl")
    killed = [r["pid"] for r in first if r["GROUP_RANK"] == "0"]
    agents[0].kill(signal.SIGKILL)
    check_survivors(agents)
    assert all_dead(killed), "the killed agent's workers outlived it"
    result = json.loads((d / "result.json").read_text())
    assert result["world_size"] == 2
    assert result["resumed_from"] >= 10
    ranks = records(d / "ranks.jsonl")
    assert sorted(r["RANK"] for r in ranks) == ["0", "1"]
    assert {r["GROUP_WORLD_SIZE"] for r in ranks} == {"2"}
    # The restart count agrees on every node (a node's death spends no restart).
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in ranks} == {"0"}
    assert {r["MASTER_ADDR"] for r in ranks} == (
        {"127.0.0.1"} if store_proxy == "on" else {"127.0.0.3"})


def test_survivors_finish_cpp_train_from_its_checkpoint(cluster, tmp_path, ddpstore):
    train = os.path.join(SDK_BIN_DIR, "train")
    if not os.path.exists(train):
        pytest.skip(f"{train} not built (configure with DDPRUN_BUILD_SDK=ON)")
    # File checkpoints only (--memory-every 0): the reference below resumes from the file, and
    # a survivor holding the dead node's in-memory replica would resume later than it
    # (tests/recovery/test_memory_replication.py covers that).
    args = ["--steps", "600", "--global-batch", "12", "--seed", "3", "--log-every", "100",
            "--checkpoint-every", "50", "--memory-every", "0"]
    ckpt = tmp_path / "ckpt"
    agents = three_nodes(cluster, ddpstore, "train-death", train, *args, "--checkpoint", ckpt,
                         no_python=True)
    wait_until(lambda: (ckpt / "checkpoint.pt").exists(), "the first checkpoint", timeout=120)
    agents[0].kill(signal.SIGKILL)
    check_survivors(agents)
    out = "".join(a.log() for a in agents[1:])
    assert "world 2" in out
    resumed = int(re.search(r"\[train\] world 2, .* resuming at step (\d+)", out).group(1))
    assert resumed >= 50

    # The same history without a death, on the same node layout: 3 nodes until that
    # checkpoint is written (train checkpoints after a step, never after its last one), then
    # 2 nodes resuming from it. (The layout matters to train's result: 2 nodes x 1 worker and
    # 1 node x 2 workers resuming from one checkpoint differ by ~2% here, an SDK matter.)
    ref_ckpt = tmp_path / "ref_ckpt"
    _, port = cluster.ddpstore(ddpstore)
    for nodes, steps in ((3, ["--steps", str(resumed + 1)]), (2, [])):
        flags = c10d_flags(f"127.0.0.1:{port}", nodes, f"reference{nodes}") + ["--no_python"]
        ref = [cluster.agent(flags, train, *args, *steps, "--checkpoint", ref_ckpt,
                             addr=f"127.0.0.{i + 2}") for i in range(nodes)]
        for r in ref:
            assert r.wait(240) == 0, r.log()
    checksum = lambda text: float(re.search(r"final params checksum: (\S+)", text).group(1))
    got, want = checksum(out), checksum(ref[0].log())
    assert abs(got - want) <= 1e-6 * abs(want), (got, want)
