"""Why a worker died of SIGKILL, on the console, in the failure summary, in the event log and in
/status (agent/process/kill_cause.hpp): a real OOM kill in a memory cgroup the test makes (a
torch 2.x worker allocating until the kernel kills it), a SIGKILL from outside, and ddprun's
own SIGKILL after the stop grace; a segfault named with the worker's Python stack (faulthandler,
on by default) from its stderr; each worker's peak RSS in /status and /metrics."""
import json
import os
import pathlib
import re
import subprocess

import pytest
from hang_helpers import (clean_env, events, health_port, http_get, jobs, records,  # noqa: F401
                          TORCH1_PYTHON, TORCH2_PYTHON, wait_until)

CGROUP_V1 = pathlib.Path("/sys/fs/cgroup/memory")
PYTHONS = {"torch1": TORCH1_PYTHON, "torch2": TORCH2_PYTHON}

ALLOCATE = r"""
import os, sys, time
if os.environ["RANK"] == "0":
    import torch
    chunks = []
    while True:  # until the kernel's OOM killer ends it
        chunks.append(torch.ones(16 * 2**20 // 4))
time.sleep(120)  # rank 1: stopped by ddprun once rank 0 is gone
"""

OUTSIDE = r"""
import os, signal, time
if os.environ["RANK"] == "1":
    blob = bytearray(64 * 2**20)  # a peak RSS to report
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(120)
"""

IGNORES_TERM = r"""
import os, signal, sys, time
if os.environ["RANK"] == "0":
    time.sleep(1)
    sys.exit(3)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ignoring SIGTERM", flush=True)
time.sleep(120)
"""

RUNS = r"""
import os, time
blob = bytearray(48 * 2**20)
for i in range(0, len(blob), 4096):
    blob[i] = 1
open(os.path.join(os.environ["OUT"], os.environ["RANK"]), "w").close()
time.sleep(120)
"""


def script(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def failure_field(stderr, name):
    m = re.search(rf"^  {name} *: (.*)$", stderr, re.M)
    return m.group(1) if m else None


@pytest.fixture
def memory_cgroup():
    """A v1 memory cgroup of 700 MiB without swap (this machine's kind; root only)."""
    if os.geteuid() != 0 or not (CGROUP_V1 / "memory.limit_in_bytes").exists():
        pytest.skip("needs root and the cgroup v1 memory controller")
    path = CGROUP_V1 / f"ddprun-test-oom-{os.getpid()}"
    path.mkdir()
    (path / "memory.limit_in_bytes").write_text(str(700 * 2**20))
    try:
        (path / "memory.swappiness").write_text("0")
    except OSError:
        pass
    yield path
    for _ in range(100):  # the killed processes leave it once reaped
        try:
            path.rmdir()
            break
        except OSError:
            subprocess.run(["sleep", "0.1"])


def test_an_oom_kill_is_named_with_the_cgroup_its_limit_and_the_rss(ddprun, tmp_path,
                                                                     memory_cgroup):
    worker = script(tmp_path, "allocate.py", ALLOCATE)
    log = tmp_path / "events.jsonl"
    # ddprun enters the cgroup before it starts (as a Slurm step or a container would put it),
    # so its workers are in it too; the allocating worker is the biggest: the kernel kills it.
    cmd = (f"echo $$ > {memory_cgroup}/cgroup.procs && exec {ddprun} --standalone "
           f"--nproc-per-node 2 --max-restarts 0 --event-log {log} --shutdown-timeout 5 "
           f"{worker}")
    r = subprocess.run(["sh", "-c", cmd], env=clean_env(python=TORCH2_PYTHON, OMP_NUM_THREADS="1"),
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 128 + 9, r.stderr  # the root cause's signal, as a shell says it
    cause = failure_field(r.stderr, "cause")
    cgroup = "/" + memory_cgroup.name
    assert cause is not None, r.stderr
    assert re.fullmatch(rf"killed by the kernel's OOM killer \(rss [\d.]+ MiB; memory cgroup "
                        rf"{cgroup} at its limit of 700.0 MiB; node [\d.]+ of [\d.]+ GiB in use\)",
                        cause), cause
    rss = float(re.search(r"rss ([\d.]+) MiB", cause).group(1))
    assert rss > 300, cause  # its anon pages and the libraries it mapped
    assert failure_field(r.stderr, "exitcode").startswith("-9 (pid: "), r.stderr
    peak = failure_field(r.stderr, "peak rss")
    assert peak and peak.endswith("MiB") and float(peak.split()[0]) > 300, r.stderr
    # The console line of the failure says it too.
    assert re.search(r"worker 0 \(rank 0, pid \d+\) was killed by SIGKILL \(exitcode -9\): "
                     r"killed by the kernel's OOM killer \(rss", r.stderr), r.stderr
    exits = [e for e in events(log, "worker_exit") if e.get("rank") == 0]
    assert exits and exits[0]["cause"] == cause, exits
    assert exits[0]["peak_rss_bytes"] > 300 * 2**20, exits


def test_a_sigkill_from_outside_is_not_taken_for_an_oom_kill(ddprun, tmp_path):
    worker = script(tmp_path, "outside.py", OUTSIDE)
    r = subprocess.run([ddprun, "--standalone", "--nproc-per-node", "2", "--max-restarts", "0",
                        "--shutdown-timeout", "5", worker],
                       env=clean_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 128 + 9, r.stderr
    cause = failure_field(r.stderr, "cause")
    assert cause and cause.startswith("killed by SIGKILL from outside ddprun"), r.stderr
    if os.geteuid() == 0:  # the kernel log and the cgroup count are readable: a firm answer
        assert re.fullmatch(r"killed by SIGKILL from outside ddprun, not by the OOM killer "
                            r"\(peak rss [\d.]+ MiB; no OOM kill of it in the kernel log"
                            r"( or its memory cgroup)?\)", cause), cause
        assert float(re.search(r"peak rss ([\d.]+) MiB", cause).group(1)) >= 64, cause


def test_ddprun_names_its_own_sigkill_after_the_grace(ddprun, tmp_path):
    worker = script(tmp_path, "ignores_term.py", IGNORES_TERM)
    log = tmp_path / "events.jsonl"
    r = subprocess.run([ddprun, "--standalone", "--nproc-per-node", "2", "--max-restarts", "0",
                        "--shutdown-timeout", "1", "--event-log", log, worker],
                       env=clean_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr  # rank 0's, the root cause
    assert "ignoring SIGTERM" in r.stdout, r.stdout
    exits = {e["rank"]: e for e in events(log, "worker_exit")}
    assert exits[0]["exit_code"] == 3 and "cause" not in exits[0], exits
    assert exits[1]["signal"] == "SIGKILL", exits
    assert exits[1]["cause"] == "killed by ddprun: SIGKILL after its stop grace of 1 s expired " \
        f"(peak rss {exits[1]['peak_rss_bytes'] / 2**20:.1f} MiB)", exits


def test_status_and_metrics_show_each_workers_rss(ddprun, jobs, tmp_path):
    worker = script(tmp_path, "runs.py", RUNS)
    env = clean_env(OUT=str(tmp_path))
    job = jobs.start(["--standalone", "--nproc-per-node", "2", "--health-port", "0",
                      "--shutdown-timeout", "5"], worker, env=env)
    port = health_port(job)
    wait_until(lambda: (tmp_path / "0").exists() and (tmp_path / "1").exists(),
               "both workers to allocate")
    status = json.loads(http_get(port, "/status")[1])
    for w in status["workers"]:
        assert w["state"] == "running", status
        assert 48 * 2**20 < w["rss_bytes"] <= w["peak_rss_bytes"], w
    _, metrics = http_get(port, "/metrics")
    for rank in (0, 1):
        for name in ("ddprun_worker_rss_bytes", "ddprun_worker_peak_rss_bytes"):
            m = re.search(rf'^{name}\{{local_rank="{rank}",rank="{rank}"\}} (\S+)$', metrics, re.M)
            assert m and float(m.group(1)) > 48 * 2**20, metrics


SEGFAULT = r"""
import ctypes, os, time
import torch


def crash_in_native_code():
    ctypes.string_at(0)


if os.environ["RANK"] == "1":
    crash_in_native_code()
time.sleep(120)
"""


@pytest.mark.parametrize("python", ["torch1", "torch2"])
def test_a_segfault_is_named_with_the_workers_python_stack(ddprun, tmp_path, python):
    worker = script(tmp_path, "segfault.py", SEGFAULT)
    r = subprocess.run([ddprun, "--standalone", "--nproc-per-node", "2", "--max-restarts", "0",
                        "--tee", "2", "--log-dir", tmp_path / "logs", worker],
                       env=clean_env(python=PYTHONS[python]),
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 128 + 11, r.stderr
    summary = r.stderr[r.stderr.index("=" * 20):]
    assert re.search(r"  exitcode  : -11 \(pid: \d+\) \(SIGSEGV\)\n"
                     r"  cause     : SIGSEGV, segmentation fault\n"
                     r"  stderr    : ", summary), summary
    assert "Fatal Python error: Segmentation fault" in summary, summary
    assert re.search(r'File ".*segfault.py", line 7 in crash_in_native_code', summary), summary
    # Without the worker's stderr in a file (the default: the console), only the name.
    r = subprocess.run([ddprun, "--standalone", "--nproc-per-node", "2", "--max-restarts", "0",
                        worker], env=clean_env(), capture_output=True, text=True, timeout=180)
    assert r.returncode == 128 + 11, r.stderr
    assert "  cause     : SIGSEGV, segmentation fault\n  peak rss  : " in r.stderr, r.stderr
    assert "Fatal Python error: Segmentation fault" in r.stderr  # on the console, by the worker
