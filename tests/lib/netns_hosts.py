"""Separate hosts on one machine for multi-node tests: one network namespace per node, joined
by veth pairs to a bridge. Host i has the address <subnet>.<i+1>/24; with `root_addr` the
root namespace is <subnet>.254 on the bridge itself (where a server the hosts share listens,
e.g. etcd). Needs root and `ip netns`: netns_unavailable() says why not, for a skip.

Names carry the test process's pid, so parallel tests do not collide; a test module passes
its own `prefix` (interface names, at most 15 characters with the pid) and `net` (the second
octet of its 10.x subnets)."""
import os
import subprocess


def ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


class Hosts:
    def __init__(self, n, prefix="ddp", net=213, root_addr=False):
        tag = f"{os.getpid() % 100000}"
        self.subnet = f"10.{net}.{os.getpid() % 250}"
        self.bridge = f"{prefix}b{tag}"
        self.names = [f"{prefix}n{tag}_{i}" for i in range(n)]
        self.veths = [f"{prefix}v{tag}_{i}" for i in range(n)]
        self.root_addr = f"{self.subnet}.254" if root_addr else None
        try:
            ip("link", "add", self.bridge, "type", "bridge")
            if self.root_addr:
                ip("addr", "add", f"{self.root_addr}/24", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
            for i, (ns, veth) in enumerate(zip(self.names, self.veths)):
                ip("netns", "add", ns)
                ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
                ip("link", "set", veth, "master", self.bridge)
                ip("link", "set", veth, "up")
                ip("-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0")
                ip("-n", ns, "link", "set", "eth0", "up")
                ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def addr(self, i):
        return f"{self.subnet}.{i + 1}"

    def cut(self, i):
        """Host i vanishes from the network: its link drops every packet, nothing is closed."""
        ip("link", "set", self.veths[i], "down")

    def restore(self, i):
        ip("link", "set", self.veths[i], "up")

    def close(self):
        for ns in self.names:
            for pid in ip("netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            ip("netns", "del", ns, check=False)
        for veth in self.veths:
            ip("link", "del", veth, check=False)
        ip("link", "del", self.bridge, check=False)


def netns_unavailable():
    """Why network namespaces cannot be used here, or None."""
    if os.geteuid() != 0:
        return "needs root for ip netns"
    probe = f"ddpprobe{os.getpid()}"
    try:
        r = ip("netns", "add", probe, check=False)
    except FileNotFoundError:
        return "the ip command (iproute2) is not installed"
    if r.returncode != 0:
        return f"ip netns does not work here: {r.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return None


class LoopbackNodes:
    """A job's nodes as loopback addresses of this machine: node i is 127.0.0.<i + 2>, the
    rendezvous store on 127.0.0.1."""
    store, store_netns, env = "127.0.0.1", None, {}

    def node(self, i):
        """(address, network namespace) of node i."""
        return f"127.0.0.{i + 2}", None

    def close(self):
        pass


class NamespaceNodes:
    """A job's nodes as separate hosts: host 0 the rendezvous store, host i + 1 node i."""

    def __init__(self, nodes, prefix, net):
        self.hosts = Hosts(nodes + 1, prefix=prefix, net=net)
        self.store, self.store_netns = self.hosts.addr(0), self.hosts.names[0]
        # Gloo finds its address from the host name, the same in every namespace: name the
        # interface, as test_netns does.
        self.env = {"GLOO_SOCKET_IFNAME": "eth0"}

    def node(self, i):
        return self.hosts.addr(i + 1), self.hosts.names[i + 1]

    def close(self):
        self.hosts.close()


def node_places(kind, nodes, prefix, net):
    """For a fixture parametrized over ["loopback", "netns"]: LoopbackNodes, or NamespaceNodes
    (`nodes` of them, Hosts' `prefix` and `net`); pytest.skip where namespaces cannot be made."""
    if kind == "loopback":
        return LoopbackNodes()
    unavailable = netns_unavailable()
    if unavailable is not None:
        import pytest
        pytest.skip(str(unavailable))
    return NamespaceNodes(nodes, prefix, net)
