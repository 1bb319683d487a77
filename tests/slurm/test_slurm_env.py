"""ddprun started with exactly the variables srun sets on each node of a step (Slurm 22.05, as
test_slurm_real.py's cluster shows them), without Slurm: the one `slurm:` line, a real
two-node Gloo job on this machine whose node list (127.0.0.[1-2], a valid Slurm host list)
names loopback addresses, flags and PET_* winning over Slurm, a batch script's environment
deriving nothing, a bad step refused with exit 2, and SIGUSR1 (Slurm's preemption warning)
forwarded to the workers when --signals-to-handle lists it."""
import json
import pathlib
import random
import re
import signal
import socket
import subprocess

from conftest import wait_for
from slurm_cluster import job_env

WORKERS = pathlib.Path(__file__).parent / "workers"


def free_job_id():
    """A job id whose derived master port (15000 + id % 10000) is free on 127.0.0.1 now."""
    for _ in range(200):
        job = random.randrange(100000, 10000000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", 15000 + job % 10000))
                return job
            except OSError:
                continue
    raise AssertionError("no free port in 15000-24999")


def srun_env(job, node, nodes=2, nodelist="127.0.0.[1-2]", tasks=None):
    """What srun -N<nodes> --ntasks-per-node=1 sets for the task on `node`."""
    tasks = nodes if tasks is None else tasks
    env = job_env()
    env.update({
        "SLURM_JOB_ID": str(job), "SLURM_JOBID": str(job), "SLURM_STEP_ID": "0",
        "SLURM_STEPID": "0", "SLURM_NNODES": str(nodes), "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_STEP_NUM_NODES": str(nodes), "SLURM_NODEID": str(node),
        "SLURM_PROCID": str(node), "SLURM_LOCALID": "0", "SLURM_GTIDS": str(node),
        "SLURM_NTASKS": str(tasks), "SLURM_NPROCS": str(tasks),
        "SLURM_STEP_NUM_TASKS": str(tasks), "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_TASKS_PER_NODE": f"1(x{nodes})", "SLURM_STEP_TASKS_PER_NODE": f"1(x{nodes})",
        "SLURM_JOB_NODELIST": nodelist, "SLURM_NODELIST": nodelist,
        "SLURM_STEP_NODELIST": nodelist, "SLURMD_NODENAME": f"127.0.0.{node + 1}",
        "SLURM_CPUS_ON_NODE": "1", "SLURM_JOB_NAME": "train", "SLURM_CLUSTER_NAME": "test",
        "SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1", "SLURM_SUBMIT_HOST": "127.0.0.1",
    })
    return env


def start(cmd, env, log_path):
    log = open(log_path, "w")
    p = subprocess.Popen([str(c) for c in cmd], env=env, stdout=log, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL)
    p.log_file = log
    return p


def finish(procs, timeout=150):
    codes = []
    try:
        for p in procs:
            codes.append(p.wait(timeout=timeout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
            p.log_file.close()
    return codes


def slurm_lines(text):
    return [line for line in text.splitlines() if "slurm:" in line]


def test_two_node_step_needs_no_flag(ddprun, tmp_path):
    job = free_job_id()
    out = tmp_path / "out"
    out.mkdir()
    procs = [start([ddprun, "--nproc-per-node=2", WORKERS / "gloo_env.py", out],
                   srun_env(job, node), tmp_path / f"node{node}.log") for node in (1, 0)]
    codes = finish(procs)
    logs = [(tmp_path / f"node{node}.log").read_text() for node in (0, 1)]
    assert codes == [0, 0], logs
    for node, log in enumerate(logs):
        lines = slurm_lines(log)
        assert len(lines) == 1, log
        assert lines[0].endswith(
            f"slurm: --nnodes=2 --node-rank={node} --master-addr=127.0.0.1 "
            f"--master-port={15000 + job % 10000} --rdzv-id={job} (from SLURM_STEP_NUM_NODES, "
            f"SLURM_NODEID, SLURM_STEP_NODELIST, SLURM_JOB_ID)"), lines[0]
    envs = [json.loads((out / f"env_{r}.json").read_text()) for r in range(4)]
    for rank, e in enumerate(envs):
        assert e["RANK"] == str(rank) and e["WORLD_SIZE"] == "4" and e["sum"] == 6.0
        assert e["GROUP_RANK"] == str(rank // 2) == e["SLURM_NODEID"]
        assert e["LOCAL_RANK"] == str(rank % 2) and e["GROUP_WORLD_SIZE"] == "2"
        assert e["TORCHELASTIC_RUN_ID"] == str(job)
        assert e["MASTER_ADDR"] and int(e["MASTER_PORT"]) > 0
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1


def test_flags_and_pet_win_over_slurm(ddprun, tmp_path):
    """--nnodes, --node-rank and --master-port on the command line and PET_RDZV_ID in the
    environment: only --master-addr is left for Slurm to imply."""
    job = free_job_id()
    out = tmp_path / "out"
    out.mkdir()
    env = srun_env(job, 1)
    env["PET_RDZV_ID"] = "from-pet"
    port = free_job_id() % 10000 + 15000
    p = start([ddprun, "--nnodes=1", "--node-rank=0", f"--master-port={port}",
               "--nproc-per-node=2", WORKERS / "gloo_env.py", out], env, tmp_path / "log")
    assert finish([p]) == [0], (tmp_path / "log").read_text()
    lines = slurm_lines((tmp_path / "log").read_text())
    assert len(lines) == 1 and lines[0].endswith(
        "slurm: --master-addr=127.0.0.1 (from SLURM_STEP_NODELIST)"), lines
    e = json.loads((out / "env_1.json").read_text())
    assert e["WORLD_SIZE"] == "2" and e["GROUP_WORLD_SIZE"] == "1"
    assert e["TORCHELASTIC_RUN_ID"] == "from-pet"


def test_batch_script_derives_nothing(ddprun, tmp_path):
    """sbatch's batch step (or an salloc shell): the job's variables, SLURM_NODEID=0 and
    SLURM_PROCID=0, no SLURM_STEP_ID: one node, started at once, with a line saying so."""
    out = tmp_path / "out"
    out.mkdir()
    env = srun_env(free_job_id(), 0)
    for k in ("SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NUM_NODES", "SLURM_STEP_NODELIST",
              "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE"):
        del env[k]
    p = start([ddprun, "--nproc-per-node=2", WORKERS / "gloo_env.py", out], env, tmp_path / "log")
    log_text = lambda: (tmp_path / "log").read_text()  # noqa: E731
    assert finish([p], timeout=60) == [0], log_text()
    lines = slurm_lines(log_text())
    assert len(lines) == 1 and "not inside an srun step" in lines[0], log_text()
    assert json.loads((out / "env_0.json").read_text())["WORLD_SIZE"] == "2"


def test_inconsistent_step_exits_2(ddprun, tmp_path):
    """srun without --ntasks-per-node=1 starts several ddprun per node: refused at once."""
    env = srun_env(free_job_id(), 0, nodes=2, tasks=16)
    r = subprocess.run([ddprun, "--nproc-per-node=2", str(WORKERS / "gloo_env.py"), "x"],
                       env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stderr
    assert "ddprun: error: slurm: the step runs 16 tasks on 2 nodes" in r.stderr
    assert "srun --ntasks-per-node=1" in r.stderr
    env = srun_env(free_job_id(), 0, nodelist="127.0.0.[1-2")
    r = subprocess.run([ddprun, str(WORKERS / "gloo_env.py"), "x"], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "unbalanced '['" in r.stderr, r.stderr
    env = srun_env(free_job_id(), 0, nodes=1, nodelist="127.0.0.1")
    env["SLURM_GPUS_ON_NODE"] = "0"
    r = subprocess.run([ddprun, "--nproc-per-node=gpu", str(WORKERS / "gloo_env.py"), "x"],
                       env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "SLURM_GPUS_ON_NODE=0" in r.stderr, r.stderr


def test_sigusr1_is_forwarded_when_listed(ddprun, tmp_path):
    """Slurm's --signal=USR1@SECONDS warning reaches ddprun; listed in --signals-to-handle, it
    goes on to every worker (which saves its checkpoint and exits) and ddprun exits 128+10."""
    out = tmp_path / "out"
    out.mkdir()
    env = srun_env(free_job_id(), 0, nodes=1, nodelist="127.0.0.1")
    p = start([ddprun, "--nproc-per-node=2", "--signals-to-handle=SIGTERM,SIGINT,SIGUSR1",
               WORKERS / "on_usr1.py", out], env, tmp_path / "log")
    try:
        ready = wait_for(lambda: all((out / f"ready_{i}").exists() for i in range(2)), 60, 0.02)
        assert ready, (tmp_path / "log").read_text()
        p.send_signal(signal.SIGUSR1)
    finally:
        codes = finish([p], timeout=60)  # kills ddprun if it is still there after 60 s
    assert codes == [128 + signal.SIGUSR1], (tmp_path / "log").read_text()
    for i in range(2):
        assert (out / f"usr1_{i}").exists(), (tmp_path / "log").read_text()
    log = (tmp_path / "log").read_text()
    assert re.search(r"received SIGUSR1: forwarding it to 2 running worker\(s\)", log), log
