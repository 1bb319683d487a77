"""The EtcdCluster fixture itself (tests/bench/rdzv relies on it too): members on free ports
that answer healthy, a leader that moves when it is stopped, members that rejoin with their
data, a cluster that comes back whole, frozen members, TLS with client certificates."""
import signal

import pytest

from etcd_cluster import EtcdCluster, EtcdError, _request


def test_one_member_keys_and_prefixes(etcd):
    assert len(etcd.endpoints) == 1 and etcd.endpoint_arg() == etcd.endpoints[0]
    assert etcd.leader_index() == 0
    etcd.put("/ddprun/a/x", "1")
    etcd.put("/ddprun/a/y", "2")
    etcd.put("/ddprun/b/x", "3")
    assert etcd.keys("/ddprun/a/") == {"/ddprun/a/x": "1", "/ddprun/a/y": "2"}
    assert len(etcd.keys()) == 3


def test_three_members_lose_and_regain_the_leader(etcd3):
    assert len(set(etcd3.endpoints)) == 3
    leader = etcd3.leader_index()
    etcd3.put("/k", "before")
    etcd3.stop_member(leader, signal.SIGKILL)
    assert etcd3.leader_index() != leader
    etcd3.put("/k", "during")
    etcd3.start_member(leader)
    etcd3.wait_healthy()
    assert etcd3.call(leader, "/health")["health"] == "true"
    assert etcd3.running_members() == [0, 1, 2]
    etcd3.stop_all(signal.SIGKILL)
    assert etcd3.running_members() == []
    with pytest.raises(EtcdError):
        etcd3.keys()
    etcd3.start_all()
    assert etcd3.keys("/k") == {"/k": "during"}


def test_frozen_member_accepts_and_never_answers(etcd3):
    etcd3.stop_member(2, signal.SIGSTOP)
    assert etcd3.running_members() == [0, 1]
    with pytest.raises(OSError):
        _request(etcd3.client_url(2) + "/health", timeout=0.5)
    etcd3.put("/k", "v")
    etcd3.start_member(2)
    etcd3.wait_healthy()
    assert etcd3.call(2, "/v3/kv/range", {"key": "L2s="})["kvs"][0]["value"] == "dg=="


def test_tls_needs_the_ca_and_a_client_certificate(tmp_path, certs):
    with EtcdCluster(tmp_path, tls=certs) as e:
        url = e.client_url(0) + "/health"
        assert url.startswith("https://")
        ok = _request(url, None, certs.ca, certs.client_cert, certs.client_key)
        assert ok["health"] == "true"
        for ca, cert, key in ((certs.wrong_ca, certs.client_cert, certs.client_key),
                              (certs.ca, None, None)):
            with pytest.raises(OSError):
                _request(url, None, ca, cert, key)
