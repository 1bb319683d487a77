"""The agent's health endpoints (/healthz, /metrics, /status) while a real job runs, clients that
misbehave, and the --event-log file."""
import json
import re
import shutil
import socket
import subprocess
import threading
import time

from hang_helpers import (all_dead, clean_env, events, free_port, health_port, http_get,
                          http_request, jobs, records, stacks_file, try_get, wait_until,
                          worker)  # noqa: F401 (jobs is a fixture)

STANDALONE = ["--standalone", "--nproc-per-node", "2"]
HB = worker("hb_worker.py")
# A SIGSTOPped worker does not act on SIGTERM until continued: only SIGKILL, after the grace
# period, ends it. A short grace keeps the tests that stop a worker fast.
STOPPED_GRACE = ["--shutdown-timeout", "3"]

METRICS = ["ddprun_restarts_total", "ddprun_reformations_total", "ddprun_hangs_total",
           "ddprun_heartbeats_total", "ddprun_attempts_total", "ddprun_max_restarts",
           "ddprun_world_size", "ddprun_group_world_size", "ddprun_rendezvous_round",
           "ddprun_rendezvous_duration_seconds", "ddprun_uptime_seconds", "ddprun_healthy",
           "ddprun_workers", "ddprun_heartbeat_age_seconds"]
STATUS_KEYS = {"job", "state", "healthy", "reason", "round", "restart_count", "max_restarts",
               "world_size", "group_rank", "group_world_size", "members", "attempts",
               "reformations", "hangs", "heartbeats", "console_dropped_lines", "uptime_s",
               "workers"}


def started(log, n=2, attempt=0):
    """The start records of attempt `attempt` once there are n of them, else None."""
    found = [r for r in records(log) if r["event"] == "start" and r["attempt"] == attempt]
    return found if len(found) >= n else None


def samples(text):
    """{(name, frozenset(labels)): value} of a Prometheus text exposition."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)(?: \d+)?", line)
        assert m, f"not a sample line: {line!r}"
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def test_healthz_is_200_while_running_then_503_when_a_worker_hangs(jobs, tmp_path):
    log, hang = tmp_path / "log", tmp_path / "hang"
    # Workers ignore SIGTERM, so the stop takes --shutdown-timeout: the window in which the
    # agent is up and must say it is unhealthy.
    job = jobs.start([*STANDALONE, "--health-port", "0", "--hang-timeout", "1",
                      "--shutdown-timeout", "5", "--max-restarts", "0"],
                     HB, log, "--hang-rank", "1", "--how", "block", "--hang-when", hang,
                     "--ignore-term", "--wait-for", tmp_path / "never")
    port = health_port(job)
    wait_until(lambda: started(log), "both workers to start")
    status, body = wait_until(lambda: try_get(port, "/healthz"), "/healthz to answer")
    assert status == 200 and body.startswith("ok: "), (status, body)
    hang.touch()
    bad = wait_until(lambda: (r := try_get(port, "/healthz")) and r[0] == 503 and r,
                     "/healthz to say 503", timeout=30)
    assert re.match(r"unhealthy: rank 1 hung: no heartbeat for [\d.]+ s", bad[1]), bad
    # The reason stays the hang through the state change that follows it and the stop after
    # that (the 5 s --shutdown-timeout window), not the bare event name.
    seen = []
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and (r := try_get(port, "/healthz")):
        seen.append(r)
        time.sleep(0.05)
    assert len(seen) > 10, seen
    for r in seen:
        assert r[0] == 503 and r[1] == bad[1], (r, bad)
    assert job.wait(60) == 124, job.output()


def test_metrics_pass_promtool_and_status_is_json(jobs, tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: install Debian's prometheus package (apt-get install " \
                     "prometheus), which provides it"
    log, go = tmp_path / "log", tmp_path / "go"
    job = jobs.start([*STANDALONE, "--health-port", "0", "--hang-timeout", "30",
                      "--max-restarts", "2"],
                     HB, log, "--interval", "0.1", "--wait-for", go)
    port = health_port(job)
    recs = wait_until(lambda: started(log), "both workers to start")
    body = wait_until(lambda: (r := try_get(port, "/metrics")) and r[0] == 200
                      and r[1].count("ddprun_heartbeat_age_seconds{") >= 2 and r[1],
                      "heartbeat ages of both workers in /metrics", timeout=30)
    r = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, f"promtool check metrics:\n{r.stdout}{r.stderr}\n---\n{body}"
    names = {name for name, _ in samples(body)}
    for name in METRICS:
        assert name in names, f"{name} missing from /metrics:\n{body}"
    s = samples(body)
    assert s[("ddprun_world_size", frozenset())] == 2
    assert s[("ddprun_max_restarts", frozenset())] == 2
    assert s[("ddprun_healthy", frozenset())] == 1
    assert s[("ddprun_hangs_total", frozenset())] == 0
    assert s[("ddprun_heartbeats_total", frozenset())] >= 2
    assert s[("ddprun_workers", frozenset({("state", "running")}))] == 2
    ages = {dict(labels)["local_rank"]: v for (name, labels), v in s.items()
            if name == "ddprun_heartbeat_age_seconds"}
    assert set(ages) == {"0", "1"} and all(0 <= a < 30 for a in ages.values()), ages

    status, text = http_get(port, "/status")
    assert status == 200, text
    st = json.loads(text)
    assert STATUS_KEYS <= set(st), set(STATUS_KEYS) - set(st)
    assert st["healthy"] is True and st["world_size"] == 2 and st["max_restarts"] == 2
    assert st["restart_count"] == 0 and st["group_rank"] == 0 and st["group_world_size"] == 1
    assert isinstance(st["members"], list) and st["members"], st
    workers = sorted(st["workers"], key=lambda w: w["local_rank"])
    assert [(w["local_rank"], w["rank"], w["state"]) for w in workers] == \
        [(0, 0, "running"), (1, 1, "running")], workers
    assert sorted(w["pid"] for w in workers) == sorted(r["pid"] for r in recs)
    assert all(isinstance(w["heartbeat_age_s"], (int, float)) for w in workers), workers

    assert http_get(port, "/nope")[0] == 404
    status, _, headers = http_request(port, "/healthz", method="POST")
    assert status == 405, status
    assert "GET" in headers.get("Allow", ""), headers
    status, body, _ = http_request(port, "/healthz", method="HEAD")
    assert status == 200 and body == ""

    go.touch()
    assert job.wait(60) == 0, job.output()


def read_until_closed(sock, timeout):
    """Everything the server sends until it closes the connection (None: still open)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk
    except ConnectionResetError:
        return data
    except socket.timeout:
        return None


SLOW_REQUEST = b"GET /healthz HTTP/1.1\r\nHost: x\r\nUser-Agent: one-byte-per-second\r\n\r\n"


def slow_client(port, slow):
    """Sends SLOW_REQUEST one byte a second; records how much it sent and when it was closed."""
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.settimeout(1.0)
        for i in range(len(SLOW_REQUEST)):
            try:
                s.sendall(SLOW_REQUEST[i:i + 1])
                slow["sent"] = i + 1
                if s.recv(1) == b"":
                    break  # closed by the server
            except socket.timeout:
                continue
            except OSError:
                break
        slow["closed_after"] = time.monotonic() - t0


def assert_closed_unserved(port, payload, what):
    """A connection sending `payload` is closed promptly, never with a 200."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        try:
            s.sendall(payload)
        except OSError:
            pass  # the server may close while we still send
        answer = read_until_closed(s, 10)
        assert answer is not None, f"a connection {what} was left open"
        assert not answer.startswith(b"HTTP/1.1 200"), answer[:200]


def test_misbehaving_clients_do_not_disturb_the_agent_or_the_job(jobs, tmp_path):
    log, go = tmp_path / "log", tmp_path / "go"
    job = jobs.start([*STANDALONE, "--health-port", "0", "--hang-timeout", "30"],
                     HB, log, "--interval", "0.1", "--wait-for", go)
    port = health_port(job)
    wait_until(lambda: started(log), "both workers to start")

    # A slow client: one byte per second. The server must close it long before it is done.
    slow = {"sent": 0, "closed_after": None}
    slow_thread = threading.Thread(target=slow_client, args=(port, slow), daemon=True)
    slow_thread.start()

    # Garbage: not HTTP. Closed (no 200), promptly.
    assert_closed_unserved(port, bytes(range(256)) * 16 + b"\r\n\r\n", "sending garbage")
    # 64 KiB of headers: refused (431 or closed), never served.
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(
        b"X-Pad-%05d: %s\r\n" % (i, b"a" * 100) for i in range(620)) + b"\r\n"
    assert len(head) > 64 * 1024
    assert_closed_unserved(port, head, "with 64 KiB of headers")

    # Meanwhile (the slow client still sending), /healthz answers.
    assert slow_thread.is_alive()
    r = try_get(port, "/healthz")
    assert r and r[0] == 200, r

    # 100 connections opened and left idle: past the server's limit they are closed at once;
    # the idle ones time out, and /healthz answers again within a bounded time.
    idle = []
    try:
        for _ in range(100):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        ok = wait_until(lambda: (r := try_get(port, "/healthz", timeout=2)) and r[0] == 200 and r,
                        "/healthz to answer with 100 idle connections open", timeout=30)
        assert ok[1].startswith("ok: ")
    finally:
        for s in idle:
            s.close()

    slow_thread.join(timeout=30)
    assert not slow_thread.is_alive(), "the slow client was never cut off"
    assert slow["closed_after"] is not None and slow["closed_after"] < 20, slow
    assert slow["sent"] < len(SLOW_REQUEST), slow  # cut off before its request was complete

    status, body = http_get(port, "/healthz")
    assert status == 200 and body.startswith("ok: "), (status, body)
    assert job.running()
    go.touch()
    assert job.wait(60) == 0, job.output()
    assert not re.search(r"\berror\b", job.stderr()), job.stderr()


def read_event_log(ev, job):
    """The event log's records: every line one JSON object of a known kind, with the common
    fields, one job, in time order."""
    lines = ev.read_text().splitlines()
    assert lines
    evs = [json.loads(line) for line in lines]
    kinds = {"transition", "round", "worker_start", "worker_exit", "hang", "exit_hang",
             "restart", "job_end"}
    for e in evs:
        assert e["event"] in kinds, e
        assert isinstance(e["time"], (int, float)) and e["time"] > 1.6e9, e
        assert e["agent_pid"] == job.pid, e
        assert isinstance(e["host"], str) and e["host"], e
    assert len({e["job"] for e in evs}) == 1, {e["job"] for e in evs}
    assert {e["event"] for e in evs} >= kinds - {"exit_hang"}, {e["event"] for e in evs}
    times = [e["time"] for e in evs]
    assert times == sorted(times)
    return evs


def check_worker_events(ev, recs):
    """worker_start matches what the workers recorded, worker_exit has exit code or signal;
    returns the pid of attempt 0's rank 1 (hung, killed by a signal)."""
    starts = events(ev, "worker_start")
    assert sorted((s["attempt"], s["rank"], s["local_rank"], s["pid"]) for s in starts) == \
        sorted((r["attempt"], r["rank"], r["local_rank"], r["pid"]) for r in recs
               if r["event"] == "start")
    exits = events(ev, "worker_exit")
    assert len(exits) == 4, exits
    for e in exits:
        assert {"local_rank", "rank", "pid", "attempt"} <= set(e), e
        assert ("exit_code" in e) != ("signal" in e), e
    assert sorted(e["exit_code"] for e in exits if e["attempt"] == 1) == [0, 0]
    hung_pid = next(r["pid"] for r in recs if r["event"] == "start" and r["rank"] == 1
                    and r["attempt"] == 0)
    hung_exit = [e for e in exits if e["pid"] == hung_pid]
    assert len(hung_exit) == 1 and "signal" in hung_exit[0], hung_exit
    return hung_pid


def test_event_log_records_hang_and_restart(jobs, tmp_path):
    log, go, ev = tmp_path / "log", tmp_path / "go", tmp_path / "events.jsonl"
    job = jobs.start([*STANDALONE, "--hang-timeout", "1.5", "--max-restarts", "1",
                      "--event-log", ev, *STOPPED_GRACE],
                     HB, log, "--hang-rank", "1", "--how", "stop", "--wait-for", go)
    wait_until(lambda: started(log, attempt=1), "attempt 1 to start")
    go.touch()
    assert job.wait(120) == 0, job.output()

    evs = read_event_log(ev, job)
    for t in events(ev, "transition"):
        assert {"from", "to", "on", "action", "round", "restart_count", "max_restarts",
                "world_size"} <= set(t), t
    for r in events(ev, "round"):
        assert {"round", "group_rank", "group_world_size", "world_size", "restart_count",
                "members", "took_s"} <= set(r), r
        assert r["world_size"] == 2 and r["members"], r
    assert sorted(r["restart_count"] for r in events(ev, "round")) == [0, 1]

    starts = events(ev, "worker_start")
    hung_pid = check_worker_events(ev, records(log))

    (hang,) = events(ev, "hang")
    assert (hang["local_rank"], hang["rank"], hang["pid"], hang["kind"]) == \
        (1, 1, hung_pid, "no_heartbeat"), hang
    assert hang["reason"].startswith("no heartbeat for"), hang
    assert hang["stacks"] == str(stacks_file(job.log_dir, 0, 1)), hang

    (restart,) = events(ev, "restart")
    assert {"attempt", "restart_count", "max_restarts"} <= set(restart), restart
    assert restart["restart_count"] == 1 and restart["max_restarts"] == 1, restart

    end = evs[-1]
    assert end["event"] == "job_end", end
    assert (end["attempts"], end["restarts"], end["reformations"], end["hangs"]) == (2, 1, 0, 1)
    assert "result" in end and isinstance(end["wall_s"], (int, float)), end
    assert all_dead([s["pid"] for s in starts], timeout=2)


def test_health_check_port_from_torchelastic_env(jobs, tmp_path):
    log, go = tmp_path / "log", tmp_path / "go"
    port = free_port()
    job = jobs.start([*STANDALONE], HB, log, "--wait-for", go,
                     env=clean_env(TORCHELASTIC_HEALTH_CHECK_PORT=port))
    assert health_port(job) == port
    wait_until(lambda: started(log), "both workers to start")
    status, body = wait_until(lambda: try_get(port, "/healthz"), "/healthz to answer")
    assert status == 200 and body.startswith("ok: "), (status, body)
    go.touch()
    assert job.wait(60) == 0, job.output()
