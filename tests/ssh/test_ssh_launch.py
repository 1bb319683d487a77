"""`ddprun --hosts/--hostfile`: one command starts a job on several hosts over real ssh.

Every host is a network namespace running Debian's OpenSSH server (ssh_hosts.py); the
launcher runs in the root namespace with a generated key. Checked: a real 2-host Gloo job
with prefixed output, variables from --export and .ddprunenv (and arguments with spaces,
quotes and $) arriving intact, a failing worker's code becoming the job's, SIGTERM/SIGINT
leaving nothing on any host, a killed ssh client stopping its host's workers (the remote
ddprun's stdin EOF), an unreachable host refused before anything starts, and a hostfile with
comments, slots and --exclude. Needs root, `ip netns` and sshd (skipped otherwise)."""
import itertools
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from ssh_hosts import SshHosts, unavailable  # noqa: E402
from jobs import closing_all  # noqa: E402

UNAVAILABLE = unavailable()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE))

WORKER = str(pathlib.Path(__file__).parent / "workers" / "report.py")
PYTHON = os.environ.get("DDPRUN_TORCH1_PYTHON", "/usr/bin/python3")


@pytest.fixture
def hosts(tmp_path):
    dirs = (tmp_path / f"ssh{i}" for i in itertools.count())
    yield from closing_all(lambda n, sshd_on=None: SshHosts(n, next(dirs), sshd_on=sshd_on))


@pytest.fixture
def workdir(tmp_path):
    d = tmp_path / "work dir"  # a space: the remote `cd` must quote it
    d.mkdir()
    (tmp_path / "home").mkdir()
    return d


def launcher_env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "TORCHELASTIC_", "MASTER_", "DDPRUN_ENV_FILE"))}
    env.update(HOME=str(tmp_path / "home"), PYTHON_EXEC=PYTHON, GLOO_SOCKET_IFNAME="eth0",
               PYTHONDONTWRITEBYTECODE="1")
    env.update(extra)
    return env


def ddprun_cmd(ddprun, h, *flags, hostfile=None):
    hosts = (["--hostfile", hostfile] if hostfile
             else ["--hosts=" + ",".join(h.addr(i) for i in range(len(h.names)))])
    return [ddprun, *hosts, "--ssh-options", h.ssh_options(),
            "--export=PYTHON_EXEC,GLOO_SOCKET_IFNAME", "--shutdown-timeout=5",
            # The store's host waits this long for goodbyes from nodes stopped at once.
            "--rdzv-conf=close_timeout=5", *flags]


def run(cmd, cwd, env, timeout=120):
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def worker_lines(out, host):
    """The workers' report lines that arrived with `host`'s prefix, parsed."""
    lines = {}
    for line in out.splitlines():
        if line.startswith(f"{host}: worker RANK="):
            fields = dict(f.split("=", 1) for f in line[len(host) + 2:].split(" ")[1:5])
            rest = line.split(" vars=", 1)[1]
            vars_text, args_text = rest.split(" args=", 1)
            fields["vars"] = json.loads(vars_text)
            fields["args"] = json.loads(args_text)
            lines[int(fields["RANK"])] = fields
    return lines


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def pid_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before, or between open and read
        return False


def ssh_clients(tmp_path):
    """ssh clients still running with this test's key (their command line names it)."""
    key = f"\0-i\0{tmp_path}/"
    found = []
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmdline = (d / "cmdline").read_text()
        except OSError:
            continue
        if key in cmdline and pid_alive(int(d.name)):
            found.append(int(d.name))
    return found


def ip_ss(h, i):
    return subprocess.run(["ip", "netns", "exec", h.names[i], "ss", "-tanp"], capture_output=True,
                          text=True).stdout


def assert_nothing_left(h, tmp_path, timeout=20):
    for i in range(len(h.names)):
        try:
            wait_for(lambda: not h.job_pids(i), timeout, f"host {i}'s processes to end")
        except AssertionError:
            ps = subprocess.run(["ps", "-o", "pid,ppid,stat,etime,args", "-p",
                                 ",".join(map(str, h.job_pids(i)))], capture_output=True,
                                text=True).stdout
            raise AssertionError(f"left on host {i}:\n{ps}\n{ip_ss(h, i)}")
    wait_for(lambda: not ssh_clients(tmp_path), timeout, "the ssh clients to end")


class Launcher:
    """A running launching ddprun, output to files."""

    def __init__(self, cmd, cwd, env, tmp_path):
        self.out_path, self.err_path = tmp_path / "launcher.out", tmp_path / "launcher.err"
        self.out, self.err = open(self.out_path, "w"), open(self.err_path, "w")
        self.p = subprocess.Popen([str(c) for c in cmd], cwd=cwd, env=env, stdout=self.out,
                                  stderr=self.err, stdin=subprocess.DEVNULL)

    def wait(self, timeout=90):
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError("launcher still running:\n" + self.text())

    def text(self):
        self.out.flush()
        self.err.flush()
        return self.out_path.read_text() + "\n--- stderr ---\n" + self.err_path.read_text()

    def close(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)
        self.out.close()
        self.err.close()


@pytest.fixture
def launchers():
    made = []

    def start(*args):
        lp = Launcher(*args)
        made.append(lp)
        return lp

    yield start
    for lp in made:
        lp.close()


def test_gloo_job_on_two_hosts_with_prefixed_output(hosts, ddprun, workdir, tmp_path):
    h = hosts(2)
    r = run(ddprun_cmd(ddprun, h, "--nproc-per-node=2", WORKER, "--gloo"), workdir,
            launcher_env(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    a, b = h.addr(0), h.addr(1)
    on_a, on_b = worker_lines(r.stdout, a), worker_lines(r.stdout, b)
    assert sorted(on_a) == [0, 1] and sorted(on_b) == [2, 3], r.stdout
    assert {f["WORLD_SIZE"] for f in [*on_a.values(), *on_b.values()]} == {"4"}
    assert {f["GROUP_RANK"] for f in on_b.values()} == {"1"}
    for rank in range(4):  # the all-reduce of ranks 0..3 ran across both hosts
        host = a if rank < 2 else b
        assert f"{host}: worker {rank} sum=6\n" in r.stdout, r.stdout
        assert f"{host}: worker {rank} on stderr\n" in r.stderr  # stderr stays stderr
        assert f"worker {rank} on stderr" not in r.stdout
    assert f"{a}: [ddprun]" in r.stderr and "starting 2 node(s) over ssh" in r.stderr
    assert_nothing_left(h, tmp_path)


def test_exports_env_files_and_quoting(hosts, ddprun, workdir, tmp_path):
    h = hosts(2)
    (tmp_path / "home" / ".ddprunenv").write_text("FROM_HOME=home\nOVERRIDDEN=home\n")
    (workdir / ".ddprunenv").write_text("# job settings\nFROM_CWD=a b 'c' $HOME\n"
                                        "OVERRIDDEN=cwd\n")
    env = launcher_env(tmp_path, FROM_CLI='it\'s "q" $PATH `x`')
    names = "FROM_HOME,FROM_CWD,OVERRIDDEN,FROM_CLI,SET_HERE"
    args = ["two words", "it's", "$HOME", '"dq"', "${local_rank}", ""]
    r = run([*ddprun_cmd(ddprun, h), "--export=PYTHON_EXEC,FROM_CLI,SET_HERE=x=1",
             WORKER, "--vars", names, "--", *args], workdir, env)
    assert r.returncode == 0, r.stdout + r.stderr
    want = {"FROM_HOME": "home", "FROM_CWD": "a b 'c' $HOME", "OVERRIDDEN": "cwd",
            "FROM_CLI": 'it\'s "q" $PATH `x`', "SET_HERE": "x=1"}
    for i in range(2):
        lines = worker_lines(r.stdout, h.addr(i))
        assert len(lines) == 1, r.stdout
        (f,) = lines.values()
        assert f["vars"] == want
        # ${local_rank} is the agent's substitution, as torchrun; the rest arrives verbatim.
        assert f["args"] == ["two words", "it's", "$HOME", '"dq"', "0", ""]


def test_failing_worker_on_second_host_fails_the_job(hosts, ddprun, workdir, tmp_path):
    h = hosts(2)
    hold = tmp_path / "hold"
    hold.mkdir()
    r = run(ddprun_cmd(ddprun, h, "--nproc-per-node=2", WORKER, "--hold", hold,
                       "--fail-node", "1", "--code", "7"), workdir, launcher_env(tmp_path))
    assert r.returncode == 7, r.stdout + r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert f"job failed: node 1 ({h.addr(1)}) exited with 7" in last, r.stderr
    assert "exiting with 7" in last
    assert_nothing_left(h, tmp_path)
    for p in hold.iterdir():
        assert not pid_alive(int(p.read_text()))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_launcher_leaves_nothing_on_any_host(hosts, ddprun, workdir, tmp_path,
                                                      launchers, sig):
    h = hosts(2)
    hold = tmp_path / "hold"
    hold.mkdir()
    lp = launchers(ddprun_cmd(ddprun, h, "--nproc-per-node=2", WORKER, "--hold", hold),
                   workdir, launcher_env(tmp_path), tmp_path)
    wait_for(lambda: len(list(hold.iterdir())) == 4, 60, "4 workers on 2 hosts")
    pids = [int(p.read_text()) for p in hold.iterdir()]
    lp.p.send_signal(sig)
    assert lp.wait(60) == 128 + sig, lp.text()
    assert f"received {sig.name}: every node was stopped" in lp.text()
    for pid in pids:
        assert not pid_alive(pid), lp.text()
    try:
        assert_nothing_left(h, tmp_path)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{lp.text()}")


def test_killed_ssh_client_stops_its_hosts_workers(hosts, ddprun, workdir, tmp_path, launchers):
    h = hosts(2)
    hold = tmp_path / "hold"
    hold.mkdir()
    lp = launchers(ddprun_cmd(ddprun, h, "--nproc-per-node=2", WORKER, "--hold", hold),
                   workdir, launcher_env(tmp_path), tmp_path)
    wait_for(lambda: len(list(hold.iterdir())) == 4, 60, "4 workers on 2 hosts")
    on_b = [int((hold / r).read_text()) for r in ("2", "3")]
    client = [p for p in ssh_clients(tmp_path)
              if f" {h.addr(1)} " in open(f"/proc/{p}/cmdline").read().replace("\0", " ")]
    assert len(client) == 1
    os.kill(client[0], signal.SIGKILL)  # the connection to host 1 is gone, nobody told it
    wait_for(lambda: not any(pid_alive(p) for p in on_b), 30, "host 1's workers to stop")
    assert lp.wait(60) == 128 + signal.SIGKILL, lp.text()
    assert f"node 1 ({h.addr(1)}) was killed by SIGKILL" in lp.text()
    try:
        assert_nothing_left(h, tmp_path)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{lp.text()}")


def test_unreachable_host_is_one_error_before_anything_starts(hosts, ddprun, workdir,
                                                              tmp_path):
    h = hosts(3, sshd_on=[0, 1])  # host 2 has an address but no sshd
    marker = tmp_path / "started"
    started = time.monotonic()
    r = run(ddprun_cmd(ddprun, h, "--ssh-connect-timeout=5", "--no-python", "touch", marker),
            workdir, launcher_env(tmp_path), timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert f"cannot reach 1 of 3 host(s) over ssh, nothing was started: {h.addr(2)} (" in lines[0]
    assert "Connection refused" in lines[0]
    assert time.monotonic() - started < 30
    assert not marker.exists()
    assert_nothing_left(h, tmp_path)


def test_missing_remote_ddprun_is_reported_before_start(hosts, ddprun, workdir, tmp_path):
    h = hosts(1)
    r = run(ddprun_cmd(ddprun, h, "--remote-ddprun=/nonexistent/ddprun", WORKER), workdir,
            launcher_env(tmp_path))
    assert r.returncode == 1
    assert f"{h.addr(0)} (no executable /nonexistent/ddprun there (see --remote-ddprun))" in r.stderr


def test_hostfile_slots_comments_and_exclude(hosts, ddprun, workdir, tmp_path):
    h = hosts(3)
    hostfile = workdir / "hostfile"
    hostfile.write_text(f"# the test cluster\n\n{h.addr(0)} slots=2  # first\n"
                        f"{h.addr(1)} slots=3\n{h.addr(2)} slots=1\n")
    r = run(ddprun_cmd(ddprun, h, f"--exclude={h.addr(1)}:0@{h.addr(2)}", WORKER, "--vars",
                       "CUDA_VISIBLE_DEVICES", hostfile=hostfile),
            workdir, launcher_env(tmp_path, CUDA_VISIBLE_DEVICES="untouched"))
    assert r.returncode == 0, r.stdout + r.stderr
    on_a, on_b = worker_lines(r.stdout, h.addr(0)), worker_lines(r.stdout, h.addr(1))
    assert sorted(on_a) == [0, 1] and sorted(on_b) == [2, 3], r.stdout
    assert not worker_lines(r.stdout, h.addr(2))
    assert {f["WORLD_SIZE"] for f in on_b.values()} == {"4"}
    # Host 1 without slot 0: its devices 1 and 2, one worker each.
    assert {f["vars"]["CUDA_VISIBLE_DEVICES"] for f in on_b.values()} == {"1,2"}
    # Host 0 was not narrowed: CUDA_VISIBLE_DEVICES is the remote's own (not sent: unset).
    assert {f["vars"]["CUDA_VISIBLE_DEVICES"] for f in on_a.values()} == {None}
    assert_nothing_left(h, tmp_path)


def test_bad_input_exits_2_with_one_line(ddprun, tmp_path):
    cases = [
        (["--hostfile", str(tmp_path / "missing"), "x.py"], "no such file"),
        (["--hosts=a,b", "--include=a:x", "x.py"], "'x' is not a slot number"),
        (["--hosts=a,b", "--node-rank=1", "x.py"], "--node-rank cannot be used with --hosts"),
        (["--include=a", "x.py"], "--include needs --hosts or --hostfile"),
    ]
    for args, message in cases:
        r = run([ddprun, *args], tmp_path, launcher_env(tmp_path), timeout=10)
        assert r.returncode == 2, r.stderr
        assert r.stdout == ""
        assert r.stderr.count("ddprun: error:") == 1 and message in r.stderr, r.stderr
