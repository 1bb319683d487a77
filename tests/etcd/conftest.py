"""Fixtures of the etcd rendezvous tests: a fresh etcd cluster per test (`etcd`: one member,
`etcd3`: three), TLS material (`certs`), and the agents (`cluster`, as in tests/multinode).
CMake registers these tests only where etcd is installed; run by hand without it they fail
with that reason rather than pass by skipping."""
import importlib.util
import pathlib

import pytest

# tests/launcher/launcher_helpers.py (under tests/multinode's helpers) does `from conftest
# import ...` meaning tests/conftest.py; with this file loaded, `conftest` is this module, so
# it offers those names, taken from a second copy of tests/conftest.py.
_spec = importlib.util.spec_from_file_location(
    "ddprun_tests_conftest", pathlib.Path(__file__).parents[1] / "conftest.py")
_root = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_root)
SOURCE_DIR, TORCH1_PYTHON = _root.SOURCE_DIR, _root.TORCH1_PYTHON
free_port, pid_alive, wait_for = _root.free_port, _root.pid_alive, _root.wait_for

from etcd_cluster import EtcdCluster, etcd_available, make_certs  # noqa: E402
from etcd_helpers import Cluster  # noqa: E402


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


@pytest.fixture
def cluster(ddprun, tmp_path):
    c = Cluster(ddprun, tmp_path)
    yield c
    c.close()
