"""How the tests reach a real etcd: TLS certificates for it (make_certs, with openssl) and its
HTTP gateway (JSON over /v3/..., no etcdctl needed). etcd_cluster.py runs the members."""
import base64
import json
import pathlib
import ssl
import subprocess
import types
import urllib.request


class CertError(AssertionError):
    """openssl could not make a certificate (its error output says why)."""


# --------------------------------------------------------------------------------------------
# Certificates


def _openssl(*args, cwd):
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise CertError(f"openssl {' '.join(args[:2])} failed: {r.stderr.strip()}")


# P-256 keys: RSA key generation costs seconds on a loaded CI machine.
_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")


def _make_ca(d, name):
    _openssl("req", "-x509", *_KEY, "-nodes", "-days", "2", "-subj",
             f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.pem",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)


def _make_leaf(d, name, ca, ext):
    (d / f"{name}.ext").write_text(ext)
    _openssl("req", *_KEY, "-nodes", "-subj", f"/CN={name}", "-keyout",
             f"{name}.key", "-out", f"{name}.csr", cwd=d)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-days", "2", "-out", f"{name}.pem", "-extfile", f"{name}.ext",
             cwd=d)


def make_certs(dir, ips=()):
    """A CA, a server certificate for 127.0.0.1, localhost and `ips`, a client certificate,
    and an unrelated CA (wrong_ca) for wrong-CA tests. Returns their paths as attributes:
    ca, server_cert, server_key, client_cert, client_key, wrong_ca."""
    d = pathlib.Path(dir)
    d.mkdir(parents=True, exist_ok=True)
    _make_ca(d, "ca")
    _make_ca(d, "wrong_ca")
    sans = ["IP:127.0.0.1", "DNS:localhost"] + [f"IP:{ip}" for ip in ips if ip != "127.0.0.1"]
    # The server certificate is also a client one: etcd's HTTP gateway dials its own gRPC
    # server with it when --client-cert-auth is on.
    _make_leaf(d, "server", "ca", "basicConstraints=CA:FALSE\n"
               "keyUsage=critical,digitalSignature,keyEncipherment\n"
               "extendedKeyUsage=serverAuth,clientAuth\n"
               f"subjectAltName={','.join(sans)}\n")
    _make_leaf(d, "client", "ca", "basicConstraints=CA:FALSE\n"
               "keyUsage=critical,digitalSignature,keyEncipherment\n"
               "extendedKeyUsage=clientAuth\n")
    return types.SimpleNamespace(
        ca=str(d / "ca.pem"), server_cert=str(d / "server.pem"),
        server_key=str(d / "server.key"), client_cert=str(d / "client.pem"),
        client_key=str(d / "client.key"), wrong_ca=str(d / "wrong_ca.pem"))


# --------------------------------------------------------------------------------------------
# The HTTP gateway (JSON over /v3/...), run here or, for a member in a netns, inside it.


def _request(url, body=None, ca=None, cert=None, key=None, timeout=2.0):
    """GET (body None) or POST JSON; returns the decoded JSON answer."""
    ctx = None
    if url.startswith("https:"):
        ctx = ssl.create_default_context(cafile=ca)
        if cert:
            ctx.load_cert_chain(cert, key)
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
        return json.loads(r.read())


def _b64(s):
    return base64.b64encode(s.encode()).decode()


def _prefix_end(prefix):
    b = bytearray(prefix.encode())
    b[-1] += 1
    return base64.b64encode(bytes(b)).decode()
