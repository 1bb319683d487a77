"""ddprun in Kubernetes pods: each test sets exactly the variables an operator writes into the
trainer container (read from the operators' sources: Kubeflow training-operator v1.9's
PyTorchJob, pkg/controller.v1/pytorch/{envvar,master,elastic}.go; Kubeflow Trainer v2's torch
plugin, pkg/runtime/framework/plugins/torch/torch.go), runs `ddprun worker.py` with no flag on
two "pods" on this machine (the operator's service names replaced by 127.0.0.1), and checks
the real Gloo workers' ranks and world and that every pod exits 0."""
import json
import subprocess

from launcher_helpers import SOURCE_DIR, clean_env, free_port

WORKER = SOURCE_DIR / "tests" / "slurm" / "workers" / "gloo_env.py"


def run_pods(ddprun, tmp_path, pod_envs, timeout=150):
    """One ddprun per pod, started together; returns (exit codes, logs, worker records)."""
    out = tmp_path / "out"
    out.mkdir()
    procs = []
    for i, extra in enumerate(pod_envs):
        log = open(tmp_path / f"pod{i}.log", "w")
        env = clean_env(**extra)
        procs.append((subprocess.Popen([ddprun, str(WORKER), str(out)], env=env, stdout=log,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL), log))
    codes = []
    try:
        for p, _ in procs:
            codes.append(p.wait(timeout=timeout))
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
            log.close()
    logs = [(tmp_path / f"pod{i}.log").read_text() for i in range(len(pod_envs))]
    records = {int(f.stem.split("_")[1]): json.loads(f.read_text()) for f in out.glob("env_*.json")}
    return codes, logs, records


def check_world(records, nodes, nproc, run_id=None):
    world = nodes * nproc
    assert sorted(records) == list(range(world)), records
    for rank, e in records.items():
        assert e["WORLD_SIZE"] == str(world) and e["sum"] == world * (world - 1) / 2
        assert e["LOCAL_WORLD_SIZE"] == str(nproc) and e["GROUP_WORLD_SIZE"] == str(nodes)
        assert e["RANK"] == str(rank)
        if run_id is not None:
            assert e["TORCHELASTIC_RUN_ID"] == run_id


def test_pytorchjob_master_and_worker(ddprun, tmp_path):
    """PyTorchJob with Master (1) and Worker (1) replicas and nprocPerNode: "2", no
    elasticPolicy: the operator's own MASTER_*/WORLD_SIZE/RANK (pod-level, which ddprun must
    replace for its workers) beside PET_MASTER_*, PET_NODE_RANK, PET_NPROC_PER_NODE, PET_NNODES."""
    port = free_port()
    pods = [{"PYTHONUNBUFFERED": "1", "MASTER_PORT": port, "PET_MASTER_PORT": port,
             "MASTER_ADDR": "127.0.0.1", "PET_MASTER_ADDR": "127.0.0.1", "WORLD_SIZE": "4",
             "RANK": str(i), "PET_NODE_RANK": str(i), "PET_NPROC_PER_NODE": "2",
             "PET_NNODES": "2"} for i in (0, 1)]
    codes, logs, records = run_pods(ddprun, tmp_path, pods)
    assert codes == [0, 0], logs
    check_world(records, nodes=2, nproc=2)
    assert [records[r]["GROUP_RANK"] for r in range(4)] == ["0", "0", "1", "1"]
    assert f"(static, 127.0.0.1:{port})" in logs[0], logs[0]


def test_pytorchjob_elastic_policy(ddprun, tmp_path):
    """PyTorchJob with Worker replicas 2 and elasticPolicy {rdzvBackend: c10d, minReplicas: 2,
    maxReplicas: 2, nProcPerNode: 2, maxRestarts: 3, rdzvId, rdzvConf}: no master, the
    rendezvous endpoint is worker-0's service and port."""
    port = free_port()
    pod = {"PYTHONUNBUFFERED": "1", "PET_RDZV_ENDPOINT": f"127.0.0.1:{port}",
           "PET_RDZV_BACKEND": "c10d", "PET_NNODES": "2:2", "PET_MAX_RESTARTS": "3",
           "PET_NPROC_PER_NODE": "2", "PET_RDZV_ID": "elastic-job",
           "PET_RDZV_CONF": "join_timeout=60,last_call_timeout=1"}
    codes, logs, records = run_pods(ddprun, tmp_path, [pod, pod])
    assert codes == [0, 0], logs
    check_world(records, nodes=2, nproc=2, run_id="elastic-job")
    assert sorted({records[r]["GROUP_RANK"] for r in range(4)}) == ["0", "1"]


def test_pytorchjob_standalone_is_an_empty_variable(ddprun, tmp_path):
    """elasticPolicy.standalone: true is written PET_STANDALONE="" (torchrun itself fails on it):
    one node on a loopback store; the rendezvous variables beside it name a service that does
    not resolve here and must not be used."""
    pod = {"PYTHONUNBUFFERED": "1", "PET_RDZV_ENDPOINT": "job-worker-0:23456",
           "PET_RDZV_BACKEND": "c10d", "PET_NNODES": "1", "PET_NPROC_PER_NODE": "2",
           "PET_STANDALONE": ""}
    codes, logs, records = run_pods(ddprun, tmp_path, [pod])
    assert codes == [0], logs
    check_world(records, nodes=1, nproc=2)
    assert "--standalone: ignoring --rdzv-backend" in logs[0], logs[0]


def test_trainer_v2_trainjob(ddprun, tmp_path):
    """Trainer v2 (TrainJob on the torch-distributed ClusterTrainingRuntime, numNodes: 2,
    numProcPerNode: 2): PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK (the Job completion
    index), PET_MASTER_ADDR (<trainjob>-node-0-0.<trainjob>), PET_MASTER_PORT (29500)."""
    port = free_port()  # 29500 in a pod; a free one here
    pods = [{"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": str(i),
             "JOB_COMPLETION_INDEX": str(i), "PET_MASTER_ADDR": "127.0.0.1",
             "PET_MASTER_PORT": port} for i in (0, 1)]
    codes, logs, records = run_pods(ddprun, tmp_path, pods)
    assert codes == [0, 0], logs
    check_world(records, nodes=2, nproc=2)
    assert [records[r]["GROUP_RANK"] for r in range(4)] == ["0", "0", "1", "1"]
