"""Helpers for multi-node tests: several ddprun agents on this machine, each a separate node
(its own --local_addr on loopback, or its own network namespace), a ddpstore endpoint, and
reading what the workers recorded. The agents and the waits are tests/lib/jobs.py's (the
`cluster` fixture comes from tests/conftest.py); what is left here is about the store.

Every process a test starts is registered with a Cluster and killed at teardown, whatever
happened. Waits are bounded: a hang fails the test instead of stalling CI.
"""
import pathlib
import socket
import struct

from testenv import (DDPRUN_ONLY_ENV, EXAMPLES, SOURCE_DIR, TORCH1_PYTHON,  # noqa: F401
                     clean_env, free_port, pid_alive, wait_for)
from jobs import (FAST_CONF, Cluster, Proc, all_dead, c10d_flags, records,  # noqa: F401
                  wait_until, worker_lookup)

worker = worker_lookup(pathlib.Path(__file__).parent)


def store_has(port, key, host="127.0.0.1"):
    """Whether the store at host:port holds `key` (a raw 2.x-dialect VALIDATE, PING, CHECK;
    the key is sent as given, the way ddprun's agents write theirs: /ddprun/<job>/...)."""
    key = key.encode()
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(b"\x00" + struct.pack("<I", 0x3C85F7CE) + b"\x0d" + struct.pack("<I", 7))
        s.recv(4)
        s.sendall(b"\x05" + struct.pack("<Q", 1) + struct.pack("<Q", len(key)) + key)
        return s.recv(1) == b"\x00"
