"""Fixtures of the etcd rendezvous tests: a fresh etcd cluster per test (`etcd`: one member,
`etcd3`: three) and TLS material (`certs`); the agents are tests/lib/jobs.py's `cluster`, which
tests/conftest.py offers every directory. CMake registers these tests only where etcd is
installed; run by hand without it they fail with that reason rather than pass by skipping."""
import pytest

from etcd_cluster import EtcdCluster, etcd_available, make_certs


def _start(tmp_path, **kwargs):
    why = etcd_available()
    assert why is None, why
    return EtcdCluster(tmp_path, **kwargs).start()


@pytest.fixture
def etcd(tmp_path):
    c = _start(tmp_path)
    yield c
    c.close()


@pytest.fixture
def etcd3(tmp_path):
    c = _start(tmp_path, members=3)
    yield c
    c.close()


@pytest.fixture
def certs(tmp_path):
    return make_certs(tmp_path / "certs")
