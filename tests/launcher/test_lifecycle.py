"""Supervision: restart on failure, exhausted restarts (summary + the worker's exit code),
signals forwarded to every worker (exit 128 + signal), SIGKILL after the grace period, and no
orphan — not even a grandchild — when ddprun itself is SIGKILLed."""
import json
import os
import re
import signal
import socket
import subprocess

import pytest

from launcher_helpers import clean_env, example, pid_alive, run, wait_for


def attempts_of(log):
    return [line.split()[:2] for line in log.read_text().splitlines()]


def test_failed_attempt_is_restarted(ddprun, tmp_path):
    log = tmp_path / "log"
    r = run([ddprun, "--standalone", "--nproc_per_node=2", "--max_restarts=1",
             example("flaky_worker.py"), log, "--fail-rank", "1", "--fail-attempts", "1"])
    assert r.returncode == 0, r.stderr
    assert sorted(attempts_of(log)) == [["0", "0"], ["0", "1"], ["1", "0"], ["1", "1"]]
    assert re.search(r"attempt 0: worker 1 \(rank 1, pid \d+\) failed with exitcode 3", r.stderr)
    assert "restarting the worker group: attempt 1 (1 of 1 restarts used)" in r.stderr
    assert "attempt 1: all 2 workers exited 0" in r.stderr
    assert "FAILED" not in r.stderr


def test_exhausted_restarts_give_summary_and_the_workers_exit_code(ddprun, tmp_path):
    log = tmp_path / "log"
    r = run([ddprun, "--standalone", "--nproc_per_node=2", "--max_restarts=2",
             example("flaky_worker.py"), log, "--fail-attempts", "9", "--exit-code", "42"])
    assert r.returncode == 42, r.stderr
    assert sorted({a for a, _ in attempts_of(log)}) == ["0", "1", "2"]
    summary = r.stderr[r.stderr.index("=" * 20):]
    assert f"{example('flaky_worker.py')} FAILED" in summary
    assert "Failures:\n  <NO_OTHER_FAILURES>" in summary
    assert "Root Cause (first observed failure):\n[0]:" in summary
    assert "  rank      : 1 (local_rank: 1)" in summary
    assert re.search(r"  exitcode  : 42 \(pid: \d+\)", summary)
    assert "  error_file: <N/A>" in summary


def test_record_error_file_is_the_summarys_traceback(ddprun, tmp_path):
    log = tmp_path / "log"
    logs = tmp_path / "logs"
    r = run([ddprun, "--standalone", "--nproc_per_node=2", "--log_dir", logs,
             example("flaky_worker.py"), log, "--mode", "raise", "--record"])
    assert r.returncode == 1, r.stderr
    m = re.search(r"  error_file: (\S+)", r.stderr)
    assert m and m.group(1).startswith(str(logs)) and m.group(1).endswith("/attempt_0/1/error.json")
    assert os.path.exists(m.group(1))
    assert "  traceback : Traceback (most recent call last):" in r.stderr
    assert "  RuntimeError: planned failure of rank 1 on attempt 0" in r.stderr
    assert re.search(r"worker 1 \(rank 1, pid \d+\) failed with exitcode 1: "
                     r"RuntimeError: planned failure of rank 1 on attempt 0", r.stderr)


def test_an_outer_error_file_gets_the_root_causes_error_with_its_code(ddprun, tmp_path):
    """TORCHELASTIC_ERROR_FILE set for ddprun itself (a scheduler watches it): the root cause's
    @record file is copied there with errorCode, as torchrun does; a worker that wrote none
    (killed) gets one made from its failure."""
    outer = tmp_path / "outer.json"
    outer.write_text("stale")
    r = run([ddprun, "--standalone", "--nproc_per_node=2", example("flaky_worker.py"),
             tmp_path / "log", "--mode", "raise", "--record"],
            env=clean_env(TORCHELASTIC_ERROR_FILE=outer))
    assert r.returncode == 1, r.stderr
    data = json.loads(outer.read_text())
    assert data["message"]["message"] == "RuntimeError: planned failure of rank 1 on attempt 0"
    assert "Traceback (most recent call last)" in data["message"]["extraInfo"]["py_callstack"]
    assert data["message"]["errorCode"] == 1
    # The workers' own error files are theirs, not the outer one.
    assert re.search(r"  error_file: \S+/attempt_0/1/error.json", r.stderr), r.stderr

    r = run([ddprun, "--standalone", "--nproc_per_node=2", example("flaky_worker.py"),
             tmp_path / "log2", "--mode", "kill", "--others-wait"],
            env=clean_env(TORCHELASTIC_ERROR_FILE=outer))
    assert r.returncode == 128 + 9, r.stderr
    data = json.loads(outer.read_text())
    assert re.fullmatch(r"Signal 9 \(SIGKILL\) received by PID \d+: killed by SIGKILL from "
                        r"outside ddprun.*", data["message"]["message"]), data
    assert data["message"]["errorCode"] == -9


def test_a_busy_master_port_names_its_holder(ddprun, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = run([ddprun, "--nnodes=1", "--nproc_per_node=1", f"--master_port={port}",
                 example("flaky_worker.py"), tmp_path / "log"])
    assert r.returncode == 1, r.stderr
    assert re.search(rf"error: cannot host the store: cannot listen on 127\.0\.0\.1:{port}: "
                     rf"Address already in use \(port {port} is held by pid {os.getpid()}: "
                     r"[^)]*pytest[^)]*\); choose another --master-port, or leave it out",
                     r.stderr), r.stderr


def test_worker_killed_by_a_signal(ddprun, tmp_path):
    r = run([ddprun, "--standalone", "--nproc_per_node=2", example("flaky_worker.py"),
             tmp_path / "log", "--mode", "kill", "--others-wait"])
    assert r.returncode == 128 + 9, r.stderr
    assert re.search(r"  exitcode  : -9 \(pid: (\d+)\)", r.stderr)
    pid = re.search(r"  exitcode  : -9 \(pid: (\d+)\)", r.stderr).group(1)
    assert f"Signal 9 (SIGKILL) received by PID {pid}" in r.stderr
    assert "was killed by SIGKILL (exitcode -9): killed by SIGKILL from outside ddprun" in r.stderr
    assert re.search(r"  cause     : killed by SIGKILL from outside ddprun", r.stderr)
    assert re.search(r"  peak rss  : [\d.]+ MiB", r.stderr)


def start_signal_workers(ddprun, tmp_path, *extra, nproc=2, flags=()):
    proc = subprocess.Popen([ddprun, "--standalone", f"--nproc_per_node={nproc}", *flags,
                             example("signal_worker.py"), str(tmp_path), *extra],
                            env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    ready = [tmp_path / f"ready_{r}" for r in range(nproc)]
    assert wait_for(lambda: all(p.exists() for p in ready), timeout=30), proc.stderr
    pids = []
    for r in range(nproc):
        pids += [int(p) for p in (tmp_path / f"pids_{r}").read_text().split()]
    return proc, pids


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_reaches_every_workers_handler(ddprun, tmp_path, sig):
    proc, pids = start_signal_workers(ddprun, tmp_path, "--grandchildren", "1")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    if sig == signal.SIGTERM:
        assert (tmp_path / "term_0").read_text() == "15\n"
        assert (tmp_path / "term_1").read_text() == "15\n"
    assert f"received {signal.Signals(sig).name}: forwarding it to 2 running worker(s)" in err
    assert not [p for p in pids if pid_alive(p)]


def test_worker_ignoring_sigterm_is_killed_after_the_grace_period(ddprun, tmp_path):
    proc, pids = start_signal_workers(ddprun, tmp_path, "--on-term", "ignore",
                                      flags=["--shutdown_timeout=1"])
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "2 worker(s) still running 1 s after SIGTERM: sending SIGKILL" in err
    assert not [p for p in pids if pid_alive(p)]


def test_second_signal_skips_the_grace_period(ddprun, tmp_path):
    proc, pids = start_signal_workers(ddprun, tmp_path, "--on-term", "ignore")  # 30 s grace
    proc.send_signal(signal.SIGTERM)
    # Two SIGTERMs sent back to back may merge into one: wait until ddprun took the first.
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "received SIGTERM" in line:
            break
    assert all(pid_alive(p) for p in pids)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 143, "".join(seen) + err
    assert "again: killing the workers now" in err
    assert not [p for p in pids if pid_alive(p)]


def test_sigkill_of_ddprun_leaves_no_worker_or_grandchild(ddprun, tmp_path):
    proc, pids = start_signal_workers(ddprun, tmp_path, "--on-term", "ignore",
                                      "--grandchildren", "2", nproc=2)
    assert len(pids) == 6 and all(pid_alive(p) for p in pids)
    proc.kill()
    proc.communicate()
    survivors = lambda: [p for p in pids if pid_alive(p)]  # noqa: E731
    assert wait_for(lambda: not survivors(), timeout=1.0), survivors()


def kill_by_pattern(token):
    """What `pkill -9 -f TOKEN` does: SIGKILL every process whose command line holds it."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if token.encode() in f.read():
                    os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass


def guardian_of(pid):
    """ddprun's orphan guardian: its child named orphan-guardian."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        for child in f.read().split():
            try:
                with open(f"/proc/{child}/comm") as c:
                    if c.read().strip() == "orphan-guardian":
                        return int(child)
            except OSError:
                pass
    return None


def test_pattern_kill_of_ddprun_spares_its_guardian(ddprun, tmp_path):
    """`pkill -9 -f ddprun` used to take the guardian too (same command line): the workers died
    of the parent-death signal, their children lived on. The guardian now has a name of its
    own, so it is left to kill the worker groups."""
    token = f"pk-{os.getpid()}-{id(tmp_path)}"
    proc, pids = start_signal_workers(ddprun, tmp_path, "--grandchildren", "2", nproc=2,
                                      flags=(f"--rdzv-id={token}",))
    guardian = guardian_of(proc.pid)
    assert guardian, "no orphan-guardian child"
    with open(f"/proc/{guardian}/cmdline", "rb") as f:
        assert f.read().split(b"\0")[:2] == [b"orphan-guardian", str(proc.pid).encode()]
    assert len(pids) == 6 and all(pid_alive(p) for p in pids)
    kill_by_pattern(token)
    proc.communicate()
    survivors = lambda: [p for p in pids if pid_alive(p)]  # noqa: E731
    assert wait_for(lambda: not survivors(), timeout=2.0), survivors()
    assert wait_for(lambda: not pid_alive(guardian), timeout=2.0)


def test_a_killed_guardian_is_replaced(ddprun, tmp_path):
    """The guardian killed first, ddprun next: ddprun has replaced it meanwhile, and the new
    one kills the worker groups."""
    proc, pids = start_signal_workers(ddprun, tmp_path, "--grandchildren", "2", nproc=2)
    first = guardian_of(proc.pid)
    assert first
    os.kill(first, signal.SIGKILL)
    second = wait_for(lambda: (g := guardian_of(proc.pid)) not in (None, first) and g,
                      timeout=5)
    assert second, "the guardian was not replaced"
    proc.kill()
    _, err = proc.communicate()
    assert re.search(rf"the orphan guardian \(pid {first}\) was killed \(SIGKILL\); a new one "
                     rf"\(pid {second}\) took over", err), err
    survivors = lambda: [p for p in pids if pid_alive(p)]  # noqa: E731
    assert wait_for(lambda: not survivors(), timeout=2.0), survivors()


DAEMON = r"""
import os, sys, time
rank = os.environ["RANK"]
if os.fork() == 0:          # the classic daemon: fork, setsid, fork again, the middle one exits
    os.setsid()
    if os.fork() == 0:
        with open(os.path.join(sys.argv[1], "daemon_" + rank), "w") as f:
            f.write(str(os.getpid()))
        os.execvp("sleep", ["sleep", "300"])
    os._exit(0)
path = os.path.join(sys.argv[1], "daemon_" + rank)
while not os.path.exists(path) or not open(path).read():
    time.sleep(0.05)
"""


def test_a_setsid_daemon_does_not_outlive_the_job(ddprun, tmp_path):
    """A worker's double-forked daemon left its process group, so no group kill reaches it;
    ddprun, the subreaper of its tree, adopts it and sweeps it when the job ends."""
    script = tmp_path / "daemon.py"
    script.write_text(DAEMON)
    r = run([ddprun, "--standalone", "--nproc_per_node=2", script, tmp_path], timeout=60)
    assert r.returncode == 0, r.stderr
    daemons = [int((tmp_path / f"daemon_{rank}").read_text()) for rank in (0, 1)]
    assert wait_for(lambda: not any(pid_alive(p) for p in daemons), timeout=2.0), daemons
    assert re.search(r"killed 2 process\(es\) the workers left running outside their process "
                     r"groups: pid \d+ \(sleep\), pid \d+ \(sleep\)", r.stderr), r.stderr


MASK = r"""
import os, sys, time
with open(os.path.join(sys.argv[1], "mask_" + os.environ["RANK"]), "w") as f:
    f.write([l for l in open("/proc/self/status") if l.startswith("SigBlk:")][0].split()[1])
time.sleep(60)
"""


def test_a_blocked_sigterm_is_unblocked_for_ddprun_and_its_workers(ddprun, tmp_path):
    """Started by a parent that blocked SIGTERM (the mask is inherited), ddprun still ends on
    SIGTERM, and its workers do not inherit the blocked mask."""
    script = tmp_path / "mask.py"
    script.write_text(MASK)
    proc = subprocess.Popen(
        [ddprun, "--standalone", "--nproc_per_node=2", script, tmp_path], env=clean_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}))
    try:
        masks = [tmp_path / f"mask_{r}" for r in (0, 1)]
        assert wait_for(lambda: all(m.exists() and m.read_text() for m in masks), timeout=30)
        assert [m.read_text() for m in masks] == ["0000000000000000"] * 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.communicate()
