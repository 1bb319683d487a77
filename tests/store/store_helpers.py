"""Helpers for the store's integration tests: run ddpstore, speak the wire protocol bytes.

The byte-level client covers what PyTorch's Python API does not reach (CANCEL_WAIT races,
queues, LIST_KEYS, BARRIER, malformed input). Frames follow
store/PROTOCOL.md; little-endian integers, u64-length strings.
"""
import contextlib
import os
import re
import resource
import select
import signal
import socket
import struct
import subprocess
import time

# Opcodes of the two dialects.
V2 = dict(VALIDATE=0x00, SET=0x01, COMPARE_SET=0x02, GET=0x03, ADD=0x04, CHECK=0x05, WAIT=0x06,
          GETNUMKEYS=0x07, DELETE_KEY=0x08, APPEND=0x09, MULTI_GET=0x0A, MULTI_SET=0x0B,
          CANCEL_WAIT=0x0C, PING=0x0D, QUEUE_PUSH=0x0E, QUEUE_POP=0x0F, QUEUE_LEN=0x10,
          LIST_KEYS=0x11, BARRIER=0x12)
V1 = dict(SET=0x00, COMPARE_SET=0x01, GET=0x02, ADD=0x03, CHECK=0x04, WAIT=0x05,
          GETNUMKEYS=0x06, WATCH_KEY=0x07, DELETE_KEY=0x08)
HELLO = b"\x00" + struct.pack("<I", 0x3C85F7CE)


def raise_fd_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def s(data):
    """A string/bytes field."""
    if isinstance(data, str):
        data = data.encode()
    return struct.pack("<Q", len(data)) + data


def i64(v):
    return struct.pack("<q", v)


def u64(v):
    return struct.pack("<Q", v)


def u32(v):
    return struct.pack("<I", v)


def keys(*ks):
    return u64(len(ks)) + b"".join(s(k) for k in ks)


def op(dialect, name, *fields):
    return bytes([dialect[name]]) + b"".join(fields)


class Conn:
    """A blocking TCP connection with exact reads and a deadline on each."""

    def __init__(self, port, host="127.0.0.1", torch2=False, timeout=20.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        if torch2:
            self.send(HELLO + op(V2, "PING", u32(0xABCD)))
            assert self.recv(4) == u32(0xABCD)

    def send(self, data):
        self.sock.sendall(data)

    def recv(self, n):
        out = b""
        deadline = time.monotonic() + self.timeout
        while len(out) < n:
            self.sock.settimeout(max(0.001, deadline - time.monotonic()))
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError(f"closed after {len(out)} of {n} bytes")
            out += chunk
        return out

    def recv_i64(self):
        return struct.unpack("<q", self.recv(8))[0]

    def recv_bytes(self):
        return self.recv(struct.unpack("<Q", self.recv(8))[0])

    def closed_by_peer(self, timeout=20.0):
        """True once the server closes the connection (EOF or reset)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.sock], [], [], deadline - time.monotonic())
            if not ready:
                return False
            try:
                if not self.sock.recv(4096):
                    return True
            except ConnectionResetError:
                return True
        return False

    def close(self):
        self.sock.close()


class Ddpstore:
    """ddpstore on a free port; stderr goes to a file so tests can read its log lines."""

    def __init__(self, binary, tmp_path, *args, host="127.0.0.1"):
        self.log_path = tmp_path / f"ddpstore-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([binary, "--host", host, "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=self._log, text=True)
        line = self.proc.stdout.readline()
        m = re.fullmatch(r"\[ddpstore(?: proxy)?\] listening on (\S+):(\d+)(?: for \S+)?\n", line)
        assert m, f"unexpected first line {line!r}"
        self.host = host
        self.port = int(m.group(2))

    def log(self):
        self._log.flush()
        return self.log_path.read_text()

    def stop(self, sig=signal.SIGTERM, timeout=20):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.proc.wait(timeout)
        self._log.close()
        return rc


@contextlib.contextmanager
def ddpstore_running(binary, tmp_path, *args, host="127.0.0.1"):
    store = Ddpstore(binary, tmp_path, *args, host=host)
    try:
        yield store
    finally:
        if store.proc.poll() is None:
            store.proc.kill()
            store.proc.wait()
        store._log.close()


class ProxiedStore:
    """ddpstore with a ddpstore --upstream proxy in front: clients use the proxy's host and port
    as they would the store's; log() has both logs."""

    def __init__(self, store, proxy):
        self.store, self.proxy = store, proxy
        self.host, self.port = proxy.host, proxy.port

    def log(self):
        return self.store.log() + self.proxy.log()


@contextlib.contextmanager
def store_running(binary, tmp_path, via_proxy):
    """The store itself, or (via_proxy) a proxy in front of it."""
    with ddpstore_running(binary, tmp_path) as store:
        if not via_proxy:
            yield store
            return
        with ddpstore_running(binary, tmp_path, "--upstream",
                              f"127.0.0.1:{store.port}") as proxy:
            yield ProxiedStore(store, proxy)
