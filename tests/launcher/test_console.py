"""A console nobody reads (a stuck log shipper, a paused pager, ssh flow control) must not stop
the agent: /healthz keeps answering, SIGTERM ends the job at once, the log files get every line,
and the console says how many lines it dropped once someone reads it again. Before, ddprun
blocked in write() to its stdout: /healthz stopped answering and SIGTERM waited for the reader."""
import http.client
import json
import os
import re
import signal
import subprocess
import time

from launcher_helpers import clean_env, free_port, wait_for

LINES = 100_000  # per worker, about 10 MB each: far more than a pipe and the console queue hold

WORKER = r"""
import os, sys, time
rank = os.environ["RANK"]
for i in range(%d):
    print(f"rank {rank} line {i:06d} " + "x" * 80)
sys.stdout.flush()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
""" % LINES


def start(ddprun, tmp_path, out_fd, port):
    worker = tmp_path / "w.py"
    worker.write_text(WORKER)
    logs = tmp_path / "logs"
    job = subprocess.Popen([ddprun, "--standalone", "--nproc-per-node=2", "--tee", "3",
                            "--log-dir", str(logs), "--health-port", str(port),
                            "--shutdown-timeout", "5", str(worker), str(tmp_path / "go")],
                           stdout=out_fd, stderr=out_fd, env=clean_env())
    return job, logs


def complete_logs(logs):
    """Both workers' stdout.log, once each holds every line."""
    files = list(logs.glob("*/attempt_0/*/stdout.log"))
    if len(files) != 2:
        return None
    texts = [f.read_text() for f in files]
    return texts if all(t.count("\n") == LINES for t in texts) else None


def try_get(port, path, timeout):
    """(status, body) of a GET to the health endpoints, or None when it failed."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read().decode()
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def status(port):
    got = try_get(port, "/status", timeout=2)
    return json.loads(got[1]) if got and got[0] == 200 else None


def test_stuck_console_neither_freezes_the_agent_nor_holds_sigterm(ddprun, tmp_path):
    read_end, write_end = os.pipe()  # nobody reads it until the job is over
    port = free_port()
    job, logs = start(ddprun, tmp_path, write_end, port)
    os.close(write_end)
    try:
        texts = wait_for(lambda: complete_logs(logs), timeout=120)
        assert texts, "the log files did not get every line"
        for text in texts:
            assert re.fullmatch(r"(rank \d line \d{6} x{80}\n)+", text)
        st = wait_for(lambda: status(port), timeout=10)
        assert st, "/status did not answer while the console was stuck"
        assert st["console_dropped_lines"] > 0, st
        metrics = try_get(port, "/metrics", timeout=2)
        assert metrics and "ddprun_console_dropped_lines_total" in metrics[1]
        began = time.monotonic()
        job.send_signal(signal.SIGTERM)
        rc = job.wait(timeout=30)
        took = time.monotonic() - began
        assert rc == 128 + signal.SIGTERM
        # The workers die of the SIGTERM at once; at most 1 s goes to the console at exit.
        assert took < 5, took
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        os.close(read_end)


def test_console_read_again_says_how_many_lines_it_dropped(ddprun, tmp_path):
    read_end, write_end = os.pipe()
    port = free_port()
    job, logs = start(ddprun, tmp_path, write_end, port)
    os.close(write_end)
    try:
        assert wait_for(lambda: complete_logs(logs), timeout=120)
        (tmp_path / "go").write_text("")  # the workers exit; the job ends as we read
        with os.fdopen(read_end, "rb") as reader:
            shown = reader.read().decode()
        read_end = None
        assert job.wait(timeout=60) == 0
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        if read_end is not None:
            os.close(read_end)
    dropped = re.findall(r"console: (\d+) line\(s\) of worker output were not shown here because "
                         r"this output was not being read; the log files have every line", shown)
    assert dropped, shown[-3000:]
    worker_lines = re.findall(r"^\[default[01]\]:rank \d line \d{6} x{80}$", shown, re.M)
    # What was shown and what was dropped add up to what the workers wrote; every line shown
    # is whole.
    assert len(worker_lines) + sum(int(n) for n in dropped) == 2 * LINES
    for line in shown.splitlines():
        assert line.startswith(("[default", "[ddprun]")), line
