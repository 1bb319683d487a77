"""Hosts reachable over real ssh for tests of `ddprun --hosts`: one network namespace per host
(tests/lib/netns_hosts.py), each running Debian's OpenSSH server on port 22 of its own
address, with a host key, a user key and a config generated in a temp dir. The launcher runs
in the root namespace, which reaches every host through the bridge (<subnet>.254).

Nothing outlives a test: close() kills every sshd and every process left in the namespaces,
then removes them. Needs root, `ip netns` and /usr/sbin/sshd: unavailable() says why not."""
import os
import pathlib
import shutil
import socket
import subprocess
import time

from netns_hosts import Hosts, ip, netns_unavailable

SSHD = "/usr/sbin/sshd"


def unavailable():
    why = netns_unavailable()
    if why:
        return why
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} is not installed (apt-get install openssh-server)"
    if not shutil.which("ssh") or not shutil.which("ssh-keygen"):
        return "ssh or ssh-keygen is not installed (apt-get install openssh-client)"
    return None


def keygen(path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True,
                   stdin=subprocess.DEVNULL, timeout=30)


class SshHosts:
    """n hosts; `sshd_on` lists those that run an sshd (default: all)."""

    def __init__(self, n, tmp, prefix="ssh", net=214, sshd_on=None):
        self.dir = pathlib.Path(tmp)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.net = Hosts(n, prefix=prefix, net=net, root_addr=True)
        self.sshds = []
        try:
            keygen(self.dir / "host_key")
            keygen(self.dir / "id")
            (self.dir / "authorized_keys").write_text((self.dir / "id.pub").read_text())
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation
            for i in (range(n) if sshd_on is None else sshd_on):
                self._start_sshd(i)
            for i in (range(n) if sshd_on is None else sshd_on):
                self._wait_listening(i)
        except BaseException:
            self.close()
            raise

    def addr(self, i):
        return self.net.addr(i)

    @property
    def names(self):
        return self.net.names

    def _start_sshd(self, i):
        config = self.dir / f"sshd_config_{i}"
        config.write_text("\n".join([
            f"ListenAddress {self.addr(i)}:22",
            f"HostKey {self.dir / 'host_key'}",
            f"AuthorizedKeysFile {self.dir / 'authorized_keys'}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "StrictModes no",
            "UsePAM no",
            "UseDNS no",
            "PrintMotd no",
            "LogLevel ERROR",
            f"PidFile {self.dir / f'sshd_{i}.pid'}",
            "",
        ]))
        log = open(self.dir / f"sshd_{i}.log", "w")
        p = subprocess.Popen(["ip", "netns", "exec", self.names[i], SSHD, "-D", "-e",
                              "-f", str(config)],
                             stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self.sshds.append((i, p, log))

    def _wait_listening(self, i, timeout=15):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((self.addr(i), 22), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"sshd on {self.addr(i)} did not start: "
                             + (self.dir / f"sshd_{i}.log").read_text())

    def ssh_options(self):
        return (f"-i {self.dir / 'id'} -F /dev/null -o UserKnownHostsFile=/dev/null "
                "-o StrictHostKeyChecking=no -o CheckHostIP=no -o LogLevel=ERROR")

    def sshd_pids(self):
        return {p.pid for _, p, _ in self.sshds}

    def job_pids(self, i):
        """Every process in host i's namespace except its sshd listener (the job's, and the
        sshd session processes serving it)."""
        out = ip("netns", "pids", self.names[i], check=False).stdout.split()
        return {int(p) for p in out} - self.sshd_pids()

    def close(self):
        for _, p, log in self.sshds:
            if p.poll() is None:
                p.kill()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
            log.close()
        self.net.close()
