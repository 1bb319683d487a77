"""Warm start (--warm-start): a Python entrypoint's workers forked from a zygote that has
imported torch must be indistinguishable from cold ones except by timing, at the first start
and at a restart, with torch 1.13 and 2.x: environment, argv, __main__, sys.path, sys.flags,
signal dispositions and mask, descriptors, rlimits, cwd, torch's thread counts, the command line
ps shows, and a @record error file; the process has one thread more (the flight-recorder
responder), and so glibc's handler of its signal 33. A zygote that dies is replaced and the attempt starts cold;
nothing outlives the job."""
import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest
from conftest import TORCH1_PYTHON, TORCH2_PYTHON
from launcher_helpers import SOURCE_DIR, clean_env, pid_alive, wait_for
from jobs import descendants

PROBE = SOURCE_DIR / "tests" / "launcher" / "warm_probe.py"
# What differs from one run of a job to the next, cold or warm.
PER_RUN_ENV = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE",
               "DDPRUN_FLIGHT_RECORDER", "TORCH_FR_DUMP_TEMP_FILE",
               "DDPRUN_HEARTBEAT_SOCKET", "DDPRUN_MEMORY_CHECKPOINT_DIR", "PROBE_OUT"}
ZYGOTE_READY = re.compile(r"warm start: zygote \(pid (\d+)\) imported")
PYTHONS = {"torch1": TORCH1_PYTHON, "torch2": TORCH2_PYTHON}


def run_job(ddprun, python, cwd, args, timeout=240, **env):
    job = subprocess.Popen([ddprun, "--standalone", "--nproc-per-node=2", *args], cwd=cwd,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=clean_env(python, **env))
    out, err = job.communicate(timeout=timeout)
    return job.pid, job.returncode, out, err


def probe_run(ddprun, python, tmp_path, warm, entry):
    out = tmp_path / warm
    out.mkdir()
    target = ["-m", "probe"] if entry == "module" else ["probe.py"]
    pid, rc, _, err = run_job(ddprun, python, tmp_path,
                              ["--max-restarts=1", f"--warm-start={warm}", *target, "arg 1", "2"],
                              PROBE_OUT=str(out))
    assert rc == 0, err
    seen = {f.stem: json.loads(f.read_text()) for f in out.glob("*.json")}
    assert sorted(seen) == ["0-0", "0-1", "1-0", "1-1"], err
    return pid, err, seen


@pytest.mark.parametrize("entry", ["script", "module"])
@pytest.mark.parametrize("torch", ["torch1", "torch2"])
def test_a_warm_worker_sees_what_a_cold_one_sees(ddprun, tmp_path, torch, entry):
    shutil.copy(PROBE, tmp_path / "probe.py")
    cold_pid, cold_log, cold = probe_run(ddprun, PYTHONS[torch], tmp_path, "off", entry)
    warm_pid, warm_log, warm = probe_run(ddprun, PYTHONS[torch], tmp_path, "on", entry)

    assert "warm start" not in cold_log
    zygote = ZYGOTE_READY.search(warm_log)
    assert zygote, warm_log
    for name in cold:
        # Started as it says: by the agent itself, or forked by the zygote (both attempts).
        assert cold[name]["volatile"]["ppid"] == cold_pid
        assert warm[name]["volatile"]["ppid"] == int(zygote.group(1)), (name, warm_log)
        c, w = cold[name]["state"], warm[name]["state"]
        assert set(c["env"]) == set(w["env"]), name
        for key in PER_RUN_ENV:
            c["env"].pop(key, None)
            w["env"].pop(key, None)
        # The one documented difference: a warm worker runs the flight-recorder responder
        # (worker-sdk/python/ddprun/flight_recorder.py), one thread more, and with it glibc's
        # handler of its internal signal 33 (SIGSETXID), which the first thread of any process
        # installs.
        assert int(w["status"].pop("Threads")) == int(c["status"].pop("Threads")) + 1, name
        setxid = 1 << 32
        assert int(w["status"].pop("SigCgt"), 16) | setxid == \
            int(c["status"].pop("SigCgt"), 16) | setxid, name
        for field in c:
            assert w[field] == c[field], f"{name}: {field} differs (warm, cold)"
    # Each warm worker draws its own random seeds, as a fresh interpreter does.
    for key in ("random", "torch_seed", "torch_rand"):
        values = [w["volatile"][key] for w in warm.values()]
        assert len(set(values)) == len(values), (key, values)


RECORDED = """
import os
from torch.distributed.elastic.multiprocessing.errors import record


def fail(rank):
    raise ValueError(f"planned failure of rank {rank}")


@record
def main():
    if os.environ["RANK"] == "0":  # one failure: the summary does not depend on who was first
        fail(os.environ["RANK"])


if __name__ == "__main__":
    main()
"""


def masked(text):
    text = re.sub(r"\d{4}-\d\d-\d\d[_ T][\d:.]+", "TIME", text)
    text = re.sub(r"pid: \d+|pid \d+", "pid N", text)
    text = re.sub(r"logs-(on|off)/[^/]+/", "LOGS/RUN/", text)
    text = re.sub(r"\[ddprun\] [^ ]+:\d+ ", "[ddprun] HOST:PID ", text)
    text = re.sub(r"peak rss  : [\d.]+ \w+", "peak rss  : N", text)  # a fork shares pages
    return re.sub(r"\d+\.\d+ s\b", "T s", text)


@pytest.mark.parametrize("torch", ["torch1", "torch2"])
def test_a_warm_worker_writes_the_same_record_error_file(ddprun, tmp_path, torch):
    (tmp_path / "recorded.py").write_text(RECORDED)
    seen = {}
    for warm in ("off", "on"):
        logs = tmp_path / f"logs-{warm}"
        _, rc, _, err = run_job(ddprun, PYTHONS[torch], tmp_path,
                                [f"--warm-start={warm}", "--redirects=2", "--log-dir", str(logs),
                                 "recorded.py"])
        assert rc == 1, err
        assert ("warm start: zygote" in err) == (warm == "on"), err
        error = json.loads(next(logs.glob("*/attempt_0/0/error.json")).read_text())
        error["message"]["extraInfo"].pop("timestamp")
        stderr = next(logs.glob("*/attempt_0/0/stderr.log")).read_text()
        summary = masked(err[err.index("=" * 20):])
        seen[warm] = (error, stderr, summary)
    cold_error, cold_stderr, cold_summary = seen["off"]
    warm_error, warm_stderr, warm_summary = seen["on"]
    assert "planned failure of rank 0" in cold_error["message"]["message"]
    assert warm_error == cold_error
    assert "<ddprun-zygote>" not in warm_stderr
    assert warm_stderr == cold_stderr
    assert warm_summary == cold_summary


STAMP = """
import os, sys, time
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
with open(os.path.join(os.environ["OUT"], f"{attempt}-{os.environ['RANK']}"), "w") as f:
    f.write(f"{os.getpid()} {os.getppid()}")
if attempt == "0":
    time.sleep(120)
"""


def stamps(out, attempt):
    files = [out / f"{attempt}-{rank}" for rank in (0, 1)]
    if not all(f.exists() and f.read_text() for f in files):
        return None
    return [tuple(map(int, f.read_text().split())) for f in files]


def start_stamped(ddprun, tmp_path, *args):
    (tmp_path / "stamp.py").write_text(STAMP)
    out = tmp_path / "out"
    out.mkdir()
    job = subprocess.Popen([ddprun, "--standalone", "--nproc-per-node=2", *args, "stamp.py"],
                           cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=clean_env(TORCH2_PYTHON, OUT=str(out)))
    return job, out


def test_a_dead_zygote_is_replaced_and_the_attempt_starts_cold(ddprun, tmp_path):
    job, out = start_stamped(ddprun, tmp_path, "--max-restarts=2", "--warm-start=on",
                             "--warm-start-modules=torch")
    try:
        first = wait_for(lambda: stamps(out, 0), timeout=120)
        assert first, "attempt 0 did not start"
        zygote = first[0][1]
        assert zygote != job.pid and first[1][1] == zygote  # both forked by the zygote
        os.kill(zygote, signal.SIGKILL)  # its workers die with it (their parent-death signal)
        _, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 0, err
    assert "warm start: the zygote failed" in err and "workers start cold" in err, err
    second = stamps(out, 1)
    assert [ppid for _, ppid in second] == [job.pid, job.pid], err  # cold: the agent's children
    for pid, _ in first:
        assert not pid_alive(pid)


def is_python(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"python" in f.read().split(b"\0")[0]
    except OSError:
        return False


def test_killing_the_agent_leaves_no_zygote_and_no_warm_worker(ddprun, tmp_path):
    job, out = start_stamped(ddprun, tmp_path, "--warm-start=on", "--warm-start-modules=torch")
    try:
        first = wait_for(lambda: stamps(out, 0), timeout=120)
        assert first, "attempt 0 did not start"
        left = descendants(job.pid)
        assert first[0][1] in left and first[0][0] in left  # the zygote and its workers
        job.kill()
        job.wait()
        assert wait_for(lambda: not any(pid_alive(p) for p in left), timeout=10), \
            [p for p in left if pid_alive(p)]
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


def test_a_signal_while_the_zygote_imports_ends_the_job_at_once(ddprun, tmp_path):
    job, out = start_stamped(ddprun, tmp_path, "--warm-start=on")
    try:
        # The zygote, not the guardian (forked before the agent handles signals).
        zygote = wait_for(lambda: [p for p in descendants(job.pid) if is_python(p)], timeout=10)
        assert zygote, "no zygote"
        began = time.monotonic()
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=30)
        took = time.monotonic() - began
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 128 + signal.SIGTERM, err
    assert took < 3, err
    assert not any(pid_alive(p) for p in zygote)
    assert not list(out.iterdir())  # no worker started


def test_auto_is_on_when_workers_may_start_again(ddprun, tmp_path):
    (tmp_path / "quiet.py").write_text("import os\n")
    _, rc, _, once = run_job(ddprun, TORCH2_PYTHON, tmp_path,
                             ["--warm-start-modules=json", "quiet.py"])
    assert rc == 0 and "warm start" not in once, once
    _, rc, _, again = run_job(ddprun, TORCH2_PYTHON, tmp_path,
                              ["--max-restarts=1", "--warm-start-modules=json", "quiet.py"])
    assert rc == 0 and "warm start: zygote" in again, again
    _, rc, _, binary = run_job(ddprun, TORCH2_PYTHON, tmp_path,
                               ["--warm-start=on", "--no-python", "/bin/true"])
    assert rc == 0, binary
    assert "--warm-start=on: the entrypoint is not a Python script" in binary, binary
