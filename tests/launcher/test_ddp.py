"""A real PyTorch DDP script (gloo, 2 workers, DistributedSampler with set_epoch, all_reduce,
all_gather_object) runs unchanged under ddprun with torch 1.13 workers and with torch 2.x
workers, including after a restart (attempt 1 must initialise against a fresh store)."""
import json

import pytest

from launcher_helpers import clean_env, example, run


def check_report(path, restart):
    report = json.loads(path.read_text())
    assert report["world_size"] == 2
    assert report["rank_sum"] == 3.0  # all_reduce of rank+1 over ranks 0 and 1
    gathered = report["gathered"]
    assert [g["rank"] for g in gathered] == [0, 1]
    assert all(g["restart"] == str(restart) for g in gathered)
    epochs = len(gathered[0]["indices"])
    for e in range(epochs):
        a, b = gathered[0]["indices"][e], gathered[1]["indices"][e]
        assert sorted(a + b) == list(range(64))  # the sampler splits the data set
    assert gathered[0]["indices"][0] != gathered[0]["indices"][1]  # set_epoch reshuffles
    return report


@pytest.mark.parametrize("which", ["torch1", "torch2"])
def test_ddp_gloo_job(ddprun, torch1_python, torch2_python, tmp_path, which):
    python = torch1_python if which == "torch1" else torch2_python
    out = tmp_path / "report.json"
    r = run([ddprun, "--standalone", "--nproc_per_node=2", example("ddp_gloo.py"), "--out", out],
            env=clean_env(python=python), timeout=300)
    assert r.returncode == 0, r.stderr
    report = check_report(out, restart=0)
    assert report["torch"].startswith("1.13" if which == "torch1" else "2.")


@pytest.mark.parametrize("which", ["torch1", "torch2"])
def test_ddp_gloo_job_restarts_on_a_fresh_store(ddprun, torch1_python, torch2_python, tmp_path,
                                                free_port_static, which):
    python = torch1_python if which == "torch1" else torch2_python
    out = tmp_path / "report.json"
    # A fixed port (static backend): attempt 1 gets a new store on the same port.
    r = run([ddprun, "--nproc_per_node=2", "--max_restarts=1", f"--master_port={free_port_static}",
             example("ddp_gloo.py"), "--out", out, "--fail-on-first-attempt", "1"],
            env=clean_env(python=python), timeout=300)
    assert r.returncode == 0, r.stderr
    assert "planned failure of rank 1" in r.stderr
    assert "restarting the worker group: attempt 1" in r.stderr
    check_report(out, restart=1)


@pytest.fixture
def free_port_static():
    from launcher_helpers import free_port
    return free_port("0.0.0.0")
