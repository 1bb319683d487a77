"""ddprun under a real Slurm (Debian's slurmctld, slurmd and munged, started by the test on free
ports, everything in a temp dir): `srun ddprun --nproc-per-node=2 worker.py` with no other flag
runs a real Gloo job whose node count, ranks, master and run id come from Slurm; a signal
delivered by Slurm (scancel --signal=USR1, what --signal=USR1@SECONDS sends before the time
limit) reaches the workers when --signals-to-handle lists it; and a two-node job, each node a
network namespace, started from an sbatch script as a user would. Skipped where Slurm is not
installed (scripts/setup installs it)."""
import json
import pathlib
import re

import pytest

from slurm_cluster import SlurmCluster, job_env, netns_unavailable, slurm_unavailable
from conftest import wait_for

UNAVAILABLE = slurm_unavailable()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE))

WORKERS = pathlib.Path(__file__).parent / "workers"
SLURM_LINE = re.compile(r"slurm: --nnodes=(\d+) --node-rank=(\d+) --master-addr=(\S+) "
                        r"--master-port=(\d+) --rdzv-id=(\d+) \(from SLURM_STEP_NUM_NODES, "
                        r"SLURM_NODEID, SLURM_STEP_NODELIST, SLURM_JOB_ID\)")


def env_dumps(out, world):
    return [json.loads((out / f"env_{r}.json").read_text()) for r in range(world)]


@pytest.fixture
def one_node(tmp_path):
    with SlurmCluster(tmp_path, n=1) as cluster:
        yield cluster


def test_srun_one_node_needs_no_flag(one_node, ddprun, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    r = one_node.run(["srun", "-N1", "--ntasks-per-node=1", "--time=2", ddprun,
                      "--nproc-per-node=2", WORKERS / "gloo_env.py", out], env=job_env(),
                     timeout=150)
    lines = [line for line in r.stderr.splitlines() if "slurm:" in line]
    assert len(lines) == 1, r.stderr
    m = SLURM_LINE.search(lines[0])
    assert m, lines[0]
    nnodes, node_rank, addr, port, job = m.groups()
    assert (nnodes, node_rank, addr) == ("1", "0", one_node.node_names[0])
    assert int(port) == 15000 + int(job) % 10000
    envs = env_dumps(out, 2)
    for rank, e in enumerate(envs):
        assert e["RANK"] == str(rank) and e["WORLD_SIZE"] == "2" and e["sum"] == 1.0
        assert e["GROUP_WORLD_SIZE"] == "1" and e["GROUP_RANK"] == "0"
        assert e["TORCHELASTIC_RUN_ID"] == job == e["SLURM_JOB_ID"]


def test_slurm_signal_reaches_the_workers(one_node, ddprun, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    srun = one_node.popen(["srun", "-N1", "--ntasks-per-node=1", "--time=2", ddprun,
                           "--nproc-per-node=2", "--signals-to-handle=SIGTERM,SIGINT,SIGUSR1",
                           WORKERS / "on_usr1.py", out], tmp_path / "srun.log", env=job_env())
    try:
        ready = wait_for(lambda: all((out / f"ready_{i}").exists() for i in range(2)), 90, 0.05)
        assert ready, (tmp_path / "srun.log").read_text() + one_node.logs()
        jobs = one_node.run(["squeue", "-h", "-o", "%i"]).stdout.split()
        assert len(jobs) == 1, jobs
        # What Slurm does at --signal=USR1@SECONDS: the signal to every task of the step.
        one_node.run(["scancel", "--signal=USR1", f"{jobs[0]}.0"])
        rc = srun.wait(timeout=90)
    finally:
        if srun.poll() is None:
            srun.kill()
            srun.wait(timeout=30)
    log = (tmp_path / "srun.log").read_text()
    assert all((out / f"usr1_{i}").exists() for i in range(2)), log
    # Slurm signals every process of the step, so the workers may get SIGUSR1 from Slurm and
    # exit before ddprun counts them: what matters is that ddprun took the signal (not its
    # default action, which would kill it) and stopped the job with 128 + SIGUSR1.
    assert re.search(r"received SIGUSR1: forwarding it to [0-2] running worker\(s\)", log), log
    assert "exiting with 138" in log, log
    assert rc != 0, log  # the job was stopped by the signal, as torchrun's agent does


@pytest.mark.skipif(netns_unavailable() is not None, reason=str(netns_unavailable()))
def test_sbatch_two_nodes(tmp_path, ddprun):
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH --nodes=2\n#SBATCH --time=2\n#SBATCH --output={tmp_path}/job.out\n"
        f"srun --ntasks-per-node=1 {ddprun} --nproc-per-node=2 "
        f"{WORKERS / 'gloo_env.py'} {out}\n")
    with SlurmCluster(tmp_path, n=2) as cluster:
        cluster.run(["sbatch", "--wait", script], env=job_env(), timeout=240)
        log = (tmp_path / "job.out").read_text()
        lines = [SLURM_LINE.search(line) for line in log.splitlines() if "slurm:" in line]
        assert len(lines) == 2 and all(lines), log
        ranks = sorted(m.group(2) for m in lines)
        assert ranks == ["0", "1"], log
        assert {m.group(3) for m in lines} == {cluster.node_names[0]}, log
        assert len({(m.group(4), m.group(5)) for m in lines}) == 1, log
        envs = env_dumps(out, 4)
    job = lines[0].group(5)
    for rank, e in enumerate(envs):
        assert e["RANK"] == str(rank) and e["WORLD_SIZE"] == "4" and e["sum"] == 6.0
        assert e["GROUP_RANK"] == str(rank // 2) == e["SLURM_NODEID"]
        assert e["GROUP_WORLD_SIZE"] == "2" and e["LOCAL_WORLD_SIZE"] == "2"
        assert e["TORCHELASTIC_RUN_ID"] == job
