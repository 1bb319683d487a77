"""ddpstore driven byte by byte: what PyTorch's Python API does not reach."""
import socket
import struct

import pytest
from conftest import wait_for

from store_helpers import (V1, V2, Conn, ddpstore_running, i64, keys, op, raise_fd_limit, s,
                           u32, u64)


@pytest.fixture
def store(ddpstore, tmp_path):
    with ddpstore_running(ddpstore, tmp_path) as st:
        yield st


def test_cancel_wait_race_replies_zero_then_one(store):
    waiter, setter = Conn(store.port, torch2=True), Conn(store.port, torch2=True)
    waiter.send(op(V2, "WAIT", keys("/k")))
    setter.send(op(V2, "SET", s("/k"), s("v")) + op(V2, "GETNUMKEYS"))
    assert setter.recv_i64() == 1  # the SET is applied: the waiter's 0x00 is on its way
    waiter.send(op(V2, "CANCEL_WAIT"))
    assert waiter.recv(2) == b"\x00\x01"
    # Without the race: only 0x01, and no stray byte later.
    waiter.send(op(V2, "WAIT", keys("/j")) + op(V2, "CANCEL_WAIT"))
    assert waiter.recv(1) == b"\x01"
    setter.send(op(V2, "SET", s("/j"), s("v")) + op(V2, "GETNUMKEYS"))
    assert setter.recv_i64() == 2
    waiter.send(op(V2, "PING", u32(5)))
    assert waiter.recv(4) == u32(5)


def test_queues(store):
    c = Conn(store.port, torch2=True)
    c.send(op(V2, "QUEUE_POP", s("q")))
    assert c.recv_i64() == 0
    for item in (b"a", b"", b"c" * 1000):
        c.send(op(V2, "QUEUE_PUSH", s("q"), s(item)))
    c.send(op(V2, "QUEUE_LEN", s("q")))
    assert c.recv_i64() == 3
    for left, item in ((3, b"a"), (2, b""), (1, b"c" * 1000)):
        c.send(op(V2, "QUEUE_POP", s("q")))
        assert c.recv_i64() == left
        assert c.recv_bytes() == item
    # A blocking pop is WAIT then QUEUE_POP: pushes release parked waiters (one per item;
    # which one first is covered by store_state_test), and each pops its own item.
    w1, w2 = Conn(store.port, torch2=True), Conn(store.port, torch2=True)
    w1.send(op(V2, "WAIT", keys("q2")))
    w2.send(op(V2, "WAIT", keys("q2")))
    c.send(op(V2, "QUEUE_PUSH", s("q2"), s("x")) + op(V2, "QUEUE_PUSH", s("q2"), s("y")))
    popped = []
    for w in (w1, w2):
        assert w.recv(1) == b"\x00"
        w.send(op(V2, "QUEUE_POP", s("q2")))
        assert w.recv_i64() in (1, 2)
        popped.append(w.recv_bytes())
    assert sorted(popped) == [b"x", b"y"]
    c.send(op(V2, "GETNUMKEYS"))
    assert c.recv_i64() == 0  # queues are not keys


def test_list_keys_and_multi_ops(store):
    c = Conn(store.port, torch2=True)
    c.send(op(V2, "MULTI_SET", i64(3), s("a"), s("1"), s("b"), s(""), s("init/"), s("2")))
    c.send(op(V2, "LIST_KEYS"))
    n = c.recv_i64()
    assert sorted(c.recv_bytes() for _ in range(n)) == [b"a", b"b", b"init/"]
    c.send(op(V2, "MULTI_GET", keys("init/", "b", "a")))
    assert [c.recv_bytes() for _ in range(3)] == [b"2", b"", b"1"]
    c.send(op(V2, "APPEND", s("a"), s("23")) + op(V2, "GET", s("a")))
    assert c.recv_bytes() == b"123"
    c.send(op(V2, "CHECK", keys("a", "zz")) + op(V2, "CHECK", keys("a", "b")))
    assert c.recv(2) == b"\x01\x00"


def test_barrier(store):
    ranks = [Conn(store.port, torch2=True) for _ in range(4)]
    for r in ranks:  # whichever arrives last releases everyone, in any order
        r.send(op(V2, "BARRIER", s("/bar"), i64(4)))
    for r in ranks:
        assert r.recv(1) == b"\x00"
    ranks[0].send(op(V2, "GET", s("/bar")))
    assert ranks[0].recv_bytes() == b"4"  # arrivals are counted like ADD
    lonely = Conn(store.port, torch2=True)
    lonely.send(op(V2, "BARRIER", s("/bar2"), i64(2)) + op(V2, "CANCEL_WAIT"))
    assert lonely.recv(1) == b"\x01"  # cancelled while parked: no 0x00


def test_split_and_pipelined_frames_both_dialects(store):
    old = Conn(store.port)
    frames = (op(V1, "ADD", s("init/"), i64(1)) + op(V1, "SET", s("/k"), s("v" * 300)) +
              op(V1, "WAIT", keys("/k")) + op(V1, "GET", s("/k")) + op(V1, "WATCH_KEY", s("/k")))
    for b in frames:
        old.send(bytes([b]))
    assert old.recv_i64() == 1
    assert old.recv(1) == b"\x00"
    assert old.recv_bytes() == b"v" * 300
    assert old.recv(1) == b"\x03"  # WATCH_KEY acknowledged
    new = Conn(store.port)
    new.send(b"".join([b"\x00\xce\xf7\x85\x3c", op(V2, "PING", u32(3)), op(V2, "GET", s("/k"))]))
    assert new.recv(4) == u32(3)
    assert new.recv_bytes() == b"v" * 300


@pytest.mark.parametrize("name,frame,reason", [
    ("unknown opcode", b"\x42", "unknown opcode 0x42 in the torch-1.13 dialect"),
    ("2.x unknown opcode", b"\x00\xce\xf7\x85\x3c\x13", "unknown opcode 0x13 in the torch-2.x"),
    ("key over 8 KiB", op(V1, "GET", u64(8193)), "GET key of 8193 bytes exceeds the 8192"),
    ("value over 8 MiB", op(V1, "SET", s("k"), u64((8 << 20) + 1)), "SET value of 8388609"),
    ("too many keys", op(V1, "CHECK", u64(1 << 40)), "CHECK with 1099511627776 keys exceeds"),
    ("ADD on text", op(V1, "SET", s("t"), s("x")) + op(V1, "ADD", s("t"), i64(1)),
     "ADD 1 on key 't' whose value is not a 64-bit decimal integer"),
])
def test_bad_input_closes_that_connection_only(store, name, frame, reason):
    bystander = Conn(store.port, torch2=True)
    bad = Conn(store.port)
    port = bad.sock.getsockname()[1]
    bad.send(frame)
    assert bad.closed_by_peer()
    log = store.log()
    assert f"closing connection from 127.0.0.1:{port} (" in log, log
    assert reason in log, log
    assert len([l for l in log.splitlines() if str(port) in l]) == 1
    bystander.send(op(V2, "SET", s("after"), s("ok")) + op(V2, "GET", s("after")))
    assert bystander.recv_bytes() == b"ok"
    assert store.proc.poll() is None


def test_peer_that_resets_right_away_is_still_named(store):
    bad = Conn(store.port)
    port = bad.sock.getsockname()[1]
    bad.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    bad.send(b"\x42")
    bad.close()  # RST, like a port scanner
    probe = Conn(store.port, torch2=True)  # the store keeps serving
    probe.send(op(V2, "PING", u32(2)))
    assert probe.recv(4) == u32(2)
    assert wait_for(lambda: f"127.0.0.1:{port}" in store.log()), store.log()


def test_limits_are_configurable(ddpstore, tmp_path):
    with ddpstore_running(ddpstore, tmp_path, "--max-value-bytes", "10", "--max-key-bytes",
                          "3", "--max-keys", "2") as st:
        c = Conn(st.port)
        c.send(op(V1, "SET", s("abc"), s("0123456789")) + op(V1, "GETNUMKEYS"))
        assert c.recv_i64() == 1
        for frame in (op(V1, "SET", s("k"), s("0123456789x")), op(V1, "GET", s("abcd")),
                      op(V1, "WAIT", keys("a", "b", "c"))):
            bad = Conn(st.port)
            bad.send(frame)
            assert bad.closed_by_peer()
        log = st.log()
        assert "SET value of 11 bytes exceeds the 10-byte limit" in log
        assert "GET key of 4 bytes exceeds the 3-byte limit" in log
        assert "WAIT with 3 keys exceeds the 2-key limit" in log


def test_thousands_of_connections_parked_then_released(store):
    raise_fd_limit()
    waiters = []
    for i in range(3000):
        c = Conn(store.port)
        c.send(op(V1, "WAIT", keys("/go")) if i % 2 else
               b"\x00\xce\xf7\x85\x3c" + op(V2, "WAIT", keys("/go")))
        waiters.append(c)
    setter = Conn(store.port, torch2=True)
    setter.send(op(V2, "SET", s("/go"), s("1")))
    for c in waiters:
        assert c.recv(1) == b"\x00"
    for c in waiters:
        c.close()
    setter.send(op(V2, "GETNUMKEYS"))
    assert setter.recv_i64() == 1
