"""Every TCPStore op of torch 2.x's Python API against the store at argv[1]:argv[2].

Run with the torch 2.x virtualenv's Python (the test runner uses Debian's torch 1.13).
use_libuv selects torch's server backend; the client is the same code either way, except
that the Python binding refuses queue ops unless use_libuv=True. Prints OK at the end.
"""
import datetime
import sys
import threading

import torch
import torch.distributed as dist

HOST, PORT = sys.argv[1], int(sys.argv[2])
MS = datetime.timedelta(milliseconds=1)


def connect(use_libuv, timeout=20000 * MS):
    return dist.TCPStore(HOST, PORT, None, False, timeout, use_libuv=use_libuv)


def check_key_ops(c, p):
    c.set(p + "a", "1")
    c.set(p + "bin", b"\x00\xff")
    assert c.get(p + "a") == b"1"
    assert c.get(p + "bin") == b"\x00\xff"
    assert c.add(p + "n", 5) == 5 and c.add(p + "n", -7) == -2 and c.get(p + "n") == b"-2"
    assert c.compare_set(p + "cas", "", "v1") == b"v1"
    assert c.compare_set(p + "nokey", "x", "y") == b"x"
    assert c.compare_set(p + "cas", "v1", "v2") == b"v2"
    assert c.compare_set(p + "cas", "zz", "v3") == b"v2"
    assert c.check([p + "a", p + "n"]) is True
    assert c.check([p + "a", p + "nokey"]) is False
    n = c.num_keys()
    assert c.delete_key(p + "a") is True and c.delete_key(p + "a") is False
    assert c.num_keys() == n - 1
    c.append(p + "app", "x")
    c.append(p + "app", "yz")
    assert c.get(p + "app") == b"xyz"
    c.multi_set([p + "m1", p + "m2"], ["1", ""])
    assert c.multi_get([p + "m1", p + "m2", p + "n"]) == [b"1", b"", b"-2"]
    keys = c.list_keys()
    assert {p + k for k in ("bin", "n", "cas", "app", "m1", "m2")} <= set(keys), keys
    assert c.has_extended_api()


def check_waits(c, other, p):
    c.wait([p + "n"])
    c.wait([p + "n"], 1000 * MS)
    for _ in range(2):  # a timed-out wait sends CANCEL_WAIT; the connection stays in sync
        try:
            c.wait([p + "never"], 100 * MS)
            raise AssertionError("wait did not time out")
        except dist.DistStoreError as e:
            assert "timeout" in str(e).lower(), e
        assert c.add(p + "after", 1) >= 1
    got = {}
    t = threading.Thread(target=lambda: got.update(v=c.get(p + "late")))
    t.start()
    other.set(p + "late", "here")
    t.join(30)
    assert got == {"v": b"here"}
    c.set_timeout(150 * MS)
    try:
        c.get(p + "missing")
        raise AssertionError("get did not time out")
    except dist.DistStoreError:
        pass
    c.set_timeout(20000 * MS)
    assert c.add(p + "after", 0) >= 2


def check_queues(c, other, p):
    assert c.queue_len(p + "q") == 0
    c.queue_push(p + "q", "a")
    c.queue_push(p + "q", b"b\x00")
    assert c.queue_len(p + "q") == 2
    assert c.queue_pop(p + "q") == b"a"
    assert c.queue_pop(p + "q", block=False) == b"b\x00"
    try:
        c.queue_pop(p + "q", block=False)
        raise AssertionError("pop of an empty queue succeeded")
    except dist.DistStoreError:  # DistQueueEmptyError
        pass
    got = {}
    t = threading.Thread(target=lambda: got.update(v=c.queue_pop(p + "q")))  # blocks
    t.start()
    other.queue_push(p + "q", "c")
    t.join(30)
    assert got == {"v": b"c"}


def check_barrier(use_libuv, p):
    errors = []

    def rank():
        try:
            connect(use_libuv).barrier(p + "bar", 3, 20000 * MS)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=rank) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    lonely = connect(use_libuv)
    try:
        lonely.barrier(p + "bar2", 2, 100 * MS)
        raise AssertionError("barrier did not time out")
    except dist.DistStoreError:
        pass
    assert lonely.add(p + "x", 1) == 1  # still in sync after the cancelled barrier


def main():
    assert int(torch.__version__.split(".")[0]) >= 2, torch.__version__
    for use_libuv in (True, False):
        p = f"libuv{int(use_libuv)}/"
        c, other = connect(use_libuv), connect(use_libuv)
        check_key_ops(c, p)
        check_waits(c, other, p)
        if use_libuv:
            check_queues(c, other, p)
        check_barrier(use_libuv, p)
        clone = c.clone()
        assert clone.get(p + "app") == b"xyz"
    print("OK", torch.__version__)


main()
