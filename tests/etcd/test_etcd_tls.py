"""`ddprun --rdzv-backend=etcd` against an etcd that serves TLS only and demands client
certificates (--client-cert-auth): a job forms with protocol=https and ddprun's or torchrun's
spellings of the certificate keys; a wrong CA, or no client certificate, fails at once with one
clear line."""
import re
import time

import pytest

from etcd_cluster import EtcdCluster
from etcd_helpers import FAST_CONF, etcd_flags, formed_re, records, worker

SPELLINGS = {"ddprun": ("cacert", "cert", "key"),
             "torchrun": ("ca_cert", "ssl_cert", "ssl_cert_key")}


@pytest.fixture
def tls_etcd(tmp_path, certs):
    c = EtcdCluster(tmp_path, tls=certs).start()
    yield c
    c.close()


def tls_conf(ca, cert, key, spelling="ddprun"):
    k_ca, k_cert, k_key = SPELLINGS[spelling]
    conf = f"{FAST_CONF},protocol=https,{k_ca}={ca}"
    if cert:
        conf += f",{k_cert}={cert},{k_key}={key}"
    return conf


@pytest.mark.parametrize("spelling", ["ddprun", "torchrun"])
def test_job_forms_over_tls(tls_etcd, certs, cluster, tmp_path, spelling):
    conf = tls_conf(certs.ca, certs.client_cert, certs.client_key, spelling)
    flags = etcd_flags(tls_etcd.endpoint_arg(), 2, f"tls-{spelling}", conf=conf)
    agents = [cluster.agent(flags, worker("record.py"), tmp_path / "log",
                            addr=f"127.0.0.{i + 2}") for i in range(2)]
    for a in agents:
        assert a.wait(60) == 0, a.log()
    assert formed_re(f"tls-{spelling}", 0, 2).search(agents[0].log()), agents[0].log()
    assert sorted(r["RANK"] for r in records(tmp_path / "log")) == ["0", "1"]
    assert any(k.startswith(f"/ddprun/tls-{spelling}/") for k in tls_etcd.keys())


@pytest.mark.parametrize("fault", ["wrong_ca", "no_client_cert"])
def test_tls_error_is_one_clear_line(tls_etcd, certs, cluster, tmp_path, fault):
    if fault == "wrong_ca":
        conf = tls_conf(certs.wrong_ca, certs.client_cert, certs.client_key)
    else:
        conf = tls_conf(certs.ca, None, None)
    flags = etcd_flags(tls_etcd.endpoint_arg(), 2, "tls-bad", conf=conf)
    t0 = time.monotonic()
    a = cluster.agent(flags, worker("record.py"), tmp_path / "log", addr="127.0.0.2")
    assert a.wait(30) == 1, a.log()
    if fault == "wrong_ca":  # a certificate that does not verify is not retried
        assert time.monotonic() - t0 < 5, a.log()
    lines = [line for line in a.log().splitlines()
             if re.search(r"(?i)\b(tls|ssl|certificate)", line)]
    assert len(lines) == 1, a.log()
    assert tls_etcd.endpoints[0] in lines[0], a.log()
    assert not (tmp_path / "log").exists()
    assert tls_etcd.keys() == {}
