"""torch 2.x's Python TCPStore client (the newest torch from PyPI, in the virtualenv)
against ddpstore: the VALIDATE + PING handshake and every op of its Python API."""
import pathlib
import subprocess

import pytest

from store_helpers import ddpstore_running, store_running

HERE = pathlib.Path(__file__).parent


@pytest.mark.parametrize("via_proxy", [False, True], ids=["direct", "proxy"])
def test_every_op_of_the_python_api(ddpstore, torch2_python, tmp_path, via_proxy):
    with store_running(ddpstore, tmp_path, via_proxy) as store:
        out = subprocess.run([torch2_python, str(HERE / "torch2_client_ops.py"), store.host,
                              str(store.port)], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.startswith("OK 2."), out.stdout
        # Nothing was rejected: no connection was closed for bad input.
        assert "closing" not in store.log(), store.log()


def test_ipv6_and_dual_stack(ddpstore, torch2_python, tmp_path):
    with ddpstore_running(ddpstore, tmp_path, host="::") as store:
        script = ("import sys, datetime, torch.distributed as d\n"
                  "for host in ('127.0.0.1', '::1'):\n"
                  "    s = d.TCPStore(host, int(sys.argv[1]), None, False,"
                  " datetime.timedelta(seconds=20))\n"
                  "    s.set('k', host)\n"
                  "    assert s.get('k') == host.encode()\n"
                  "print('OK')\n")
        out = subprocess.run([torch2_python, "-c", script, str(store.port)],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "OK" in out.stdout, out.stdout + out.stderr
