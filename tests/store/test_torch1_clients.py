"""torch 1.13's own Python TCPStore client (this interpreter is Debian's torch 1.13) against
ddpstore: every op it has, including the timed-out WAIT that desyncs torch's own server."""
import datetime
import threading

import pytest
import torch.distributed as dist

from store_helpers import store_running

SECONDS = datetime.timedelta(seconds=1)


@pytest.fixture(params=[False, True], ids=["direct", "proxy"])
def store(ddpstore, tmp_path, request):
    with store_running(ddpstore, tmp_path, request.param) as st:
        yield st


def client(store, timeout=20 * SECONDS, world_size=None):
    return dist.TCPStore(store.host, store.port, world_size, False, timeout)


def test_every_op(store):
    c = client(store, world_size=3)  # a non-master client with world_size joins via ADD init/
    c.set("a", "1")
    c.set("bin", b"\x00\xff")
    assert c.get("a") == b"1"
    assert c.get("bin") == b"\x00\xff"
    assert c.add("n", 5) == 5
    assert c.add("n", -7) == -2
    assert c.add("n", 0) == -2
    assert c.get("n") == b"-2"
    assert c.compare_set("cas", "", "v1") == b"v1"       # absent, expected empty: created
    assert c.compare_set("nokey", "x", "y") == b"x"      # absent, expected given: unchanged
    assert c.compare_set("cas", "v1", "v2") == b"v2"     # equal: swapped
    assert c.compare_set("cas", "zz", "v3") == b"v2"     # different: current value
    assert c.num_keys() == 5                             # a, bin, n, cas + init/
    assert c.delete_key("a") is True
    assert c.delete_key("a") is False
    assert c.num_keys() == 4
    c.wait(["bin", "n"])
    c.wait(["bin"], 2 * SECONDS)
    c.set_timeout(5 * SECONDS)
    assert c.get("cas") == b"v2"
    c.set("empty", "")
    assert c.get("empty") == b""


def test_wait_and_get_block_until_another_client_sets(store):
    waiter, setter = client(store), client(store)
    got = {}

    def run():
        waiter.wait(["k1", "k2"])
        got["v"] = waiter.get("k2")

    t = threading.Thread(target=run)
    t.start()
    setter.set("k1", "a")
    setter.set("k2", "b")
    t.join(30)
    assert got == {"v": b"b"}


def test_connection_survives_a_timed_out_wait(store):
    c, other = client(store), client(store)
    with pytest.raises(RuntimeError, match="[Tt]imeout"):
        c.wait(["never"], datetime.timedelta(milliseconds=200))
    # The client moved on (its next request reaches the server first). torch 1.13's own
    # server would still send a stray 0x00 once "never" appears, and this client would read
    # it as the first byte of its next reply. Ours drops the wait at the next request.
    assert c.add("counter", 1) == 1
    other.set("never", "now")
    assert other.add("counter", 0) == 1  # "never" is set before c's next request arrives
    assert c.add("counter", 1) == 2
    assert c.get("never") == b"now"
    c.set_timeout(datetime.timedelta(milliseconds=200))
    with pytest.raises(RuntimeError, match="[Tt]imeout"):
        c.get("missing-too")  # get = wait + get
    c.set_timeout(20 * SECONDS)
    assert c.num_keys() == 2
    other.set("missing-too", "x")
    assert other.num_keys() == 3
    assert c.get("missing-too") == b"x"


def test_many_clients(store):
    clients = [client(store) for _ in range(50)]  # 100 sockets: 1.13 opens two per client
    for i, c in enumerate(clients):
        c.add("joined", 1)
    assert clients[0].get("joined") == b"50"
