"""A real Slurm cluster for one test: Debian's munged, slurmctld and slurmd started by the test
itself (as root), with a slurm.conf, a munge key and every state directory in a temp dir and
free ports, so it touches nothing of the machine's own Slurm and runs beside other tests.

One node: slurmd in this network namespace, named after this machine's host name (so the
node name resolves, as on a real cluster). Several nodes: one network namespace per node
(netns_hosts.Hosts), slurmctld on the bridge; /etc/netns/<ns>/hosts (which `ip netns exec`
mounts over /etc/hosts) makes the node names resolve inside each node.

Every daemon runs in its own PID namespace (unshare --pid --kill-child): killing it at close()
takes its children (slurmstepd, the job's tasks) with it, whatever state the test left.
slurm_unavailable() says why no cluster can be started here, for a skip.
"""
import os
import pathlib
import shutil
import signal
import socket
import subprocess

from testenv import TORCH1_PYTHON, free_port, wait_for
from netns_hosts import Hosts, netns_unavailable  # noqa: F401

DAEMONS = {"munged": "/usr/sbin/munged", "slurmctld": "/usr/sbin/slurmctld",
           "slurmd": "/usr/sbin/slurmd"}
CLIENTS = ["srun", "sbatch", "sinfo", "squeue", "scancel", "munge"]
PLUGIN_DIR = "/usr/lib/x86_64-linux-gnu/slurm-wlm"



# The environment of a job step: nothing a surrounding torchrun, ddprun or Slurm left behind.
def job_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "TORCHELASTIC_", "MASTER_", "SLURM_", "OMP_NUM_THREADS"))
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env["PYTHON_EXEC"] = TORCH1_PYTHON
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env

def slurm_unavailable():
    """Why a Slurm cluster cannot be started here, or None."""
    missing = [n for n, p in DAEMONS.items() if not os.access(p, os.X_OK)]
    missing += [c for c in CLIENTS if not shutil.which(c)]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing; scripts/setup installs it)"
    if os.geteuid() != 0:
        return "starting slurmd needs root"
    if not shutil.which("unshare"):
        return "unshare (util-linux) is missing"
    return None


CONF = """\
ClusterName={cluster}
SlurmctldHost={ctld_name}({ctld_addr})
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={tmp}/munge/munge.sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation={tmp}/state
SlurmdSpoolDir={tmp}/spool/%n
SlurmctldPidFile={tmp}/slurmctld.pid
SlurmdPidFile={tmp}/slurmd-%n.pid
SlurmctldLogFile={tmp}/log/slurmctld.log
SlurmdLogFile={tmp}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
KillWait=5
SlurmctldDebug=debug2
SlurmdDebug=debug2
PluginDir={plugin_dir}
{nodes}
PartitionName=test Nodes=ALL Default=YES MaxTime=10 State=UP
"""


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def _kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class SlurmCluster:
    """`n` nodes; n > 1 puts each in its own network namespace. Use as a context manager or
    call close(): it always kills every daemon and removes what it created."""

    def __init__(self, tmp_path, n=1, net=214):
        self.tmp = pathlib.Path(tmp_path) / "slurm"
        self.daemons = []
        self.hosts = None
        try:
            self._start(n, net)
        except BaseException:
            self.close()
            raise

    def _start(self, n, net):
        for d in ("state", "spool", "log", "munge"):
            (self.tmp / d).mkdir(parents=True)
        os.chmod(self.tmp / "munge", 0o700)
        tag = f"{os.getpid() % 100000}"
        if n == 1:
            self.node_names = [socket.gethostname()]
            self.node_addrs = ["127.0.0.1"]
            ctld_addr = "127.0.0.1"
        else:
            self.hosts = Hosts(n, prefix="slm", net=net, root_addr=True)
            self.node_names = [f"slm{tag}n{i}" for i in range(n)]
            self.node_addrs = [self.hosts.addr(i) for i in range(n)]
            ctld_addr = self.hosts.root_addr
            self._write_hosts_files()
        for name in self.node_names:  # slurmstepd's sockets, through which signals go
            (self.tmp / "spool" / name).mkdir()
        self.conf = self.tmp / "slurm.conf"
        nodes = "\n".join(f"NodeName={name} NodeAddr={addr} CPUs=2 State=UNKNOWN"
                          for name, addr in zip(self.node_names, self.node_addrs))
        self.conf.write_text(CONF.format(
            cluster=f"ddp{tag}", ctld_name=socket.gethostname(), ctld_addr=ctld_addr,
            ctld_port=free_port(), slurmd_port=free_port(), tmp=self.tmp, plugin_dir=PLUGIN_DIR,
            nodes=nodes))
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._start_munged()
        self._daemon("slurmctld", [DAEMONS["slurmctld"], "-D", "-i", "-f", self.conf])
        for i, name in enumerate(self.node_names):
            where = {"netns": self.hosts.names[i], "host": name} if self.hosts else {}
            self._daemon(f"slurmd-{name}", [DAEMONS["slurmd"], "-D", "-f", self.conf, "-N", name],
                         **where)
        if not wait_for(self._all_idle, timeout=60, interval=0.2):
            raise AssertionError("Slurm nodes did not become idle:\n" + self.logs())

    def _write_hosts_files(self):
        # Every node resolves every node's name, its own (its host name) included.
        path = self.tmp / "hosts"
        lines = ["127.0.0.1 localhost"]
        lines += [f"{a} {nm}" for nm, a in zip(self.node_names, self.node_addrs)]
        path.write_text("\n".join(lines) + "\n")
        self.hosts_file = path

    def _start_munged(self):
        key = self.tmp / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        m = self.tmp / "munge"
        self._daemon("munged", [DAEMONS["munged"], "-F", "--force", f"--key-file={key}",
                                f"--socket={m}/munge.sock", f"--pid-file={m}/munged.pid",
                                f"--log-file={self.tmp}/log/munged.log", f"--seed-file={m}/seed"])
        ok = wait_for(lambda: (m / "munge.sock").exists(), timeout=20)
        assert ok, "munged did not start:\n" + self.logs()

    def _daemon(self, name, cmd, netns=None, host=None):
        cmd = [str(c) for c in cmd]
        uts = []
        if host:  # a node of its own: its host name (UTS namespace) and /etc/hosts (mount ns)
            cmd = ["sh", "-c", 'mount --bind "$0" /etc/hosts && hostname "$1" && shift && '
                   'exec "$@"', str(self.hosts_file), host, *cmd]
            uts = ["--uts"]
        # --mount-proc: proctrack/linuxproc finds a step's processes in /proc by their pids
        # as slurmstepd sees them, so /proc must be this PID namespace's.
        cmd = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", *uts, *cmd]
        if netns:  # only the network: `ip netns exec` would remount /sys, hiding the cgroups
            cmd = ["nsenter", f"--net=/run/netns/{netns}", *cmd]
        log = open(self.tmp / "log" / f"{name}.out", "w")
        p = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        self.daemons.append((name, p, log))

    def _all_idle(self):
        r = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=20, check=False)
        states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
        return all(states.get(n) == "idle" for n in self.node_names)

    def run(self, cmd, timeout=120, check=True, env=None):
        """A Slurm client command (srun, sbatch, ...) against this cluster."""
        r = subprocess.run([str(c) for c in cmd], env={**(env or os.environ),
                                                       "SLURM_CONF": str(self.conf)},
                           capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"{cmd[:3]} exited {r.returncode}:\n{r.stdout}\n{r.stderr}\n"
                                 + self.logs())
        return r

    def popen(self, cmd, log_path, env=None):
        """A Slurm client command running in the background, its output in `log_path`."""
        return subprocess.Popen([str(c) for c in cmd],
                                env={**(env or os.environ), "SLURM_CONF": str(self.conf)},
                                stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)

    def logs(self):
        parts = []
        for f in sorted((self.tmp / "log").glob("*")):
            text = f.read_text(errors="replace").splitlines()[-30:]
            parts.append(f"--- {f.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def close(self):
        for _, p, log in reversed(self.daemons):
            # The PID namespace's first process first: unshare then reaps it and exits, and
            # the kernel kills whatever else ran in that namespace (slurmstepd, tasks).
            for child in _children(p.pid):
                _kill(child)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _kill(p.pid)
                p.wait(timeout=30)
            log.close()
        self.daemons = []
        if self.hosts:
            self.hosts.close()
            self.hosts = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
