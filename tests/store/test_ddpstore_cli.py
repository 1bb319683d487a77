"""The ddpstore command line: flags, the address line, signals, bind errors."""
import signal
import socket
import subprocess

import pytest

from store_helpers import V1, Conn, Ddpstore, ddpstore_running, i64, keys, op, s


def run(binary, *args):
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=30)


def test_help(ddpstore):
    out = run(ddpstore, "--help")
    assert out.returncode == 0
    assert out.stdout.startswith("usage: ddpstore")
    for flag in ("--host", "--port", "--token-file", "--max-key-bytes", "--max-value-bytes",
                 "--max-keys"):
        assert flag in out.stdout


@pytest.mark.parametrize("args,message", [
    (["--bogus"], "ddpstore: unknown option '--bogus' (see ddpstore --help)\n"),
    (["--port", "70000"], "ddpstore: --port needs a number in 0..65535, got '70000' (see "
                          "ddpstore --help)\n"),
    (["--port=abc"], "ddpstore: --port needs a number in 0..65535, got 'abc' (see ddpstore "
                     "--help)\n"),
    (["--port"], "ddpstore: --port needs a value (see ddpstore --help)\n"),
    (["stray"], "ddpstore: unexpected argument 'stray' (see ddpstore --help)\n"),
])
def test_bad_flags_exit_2_with_one_line(ddpstore, args, message):
    out = run(ddpstore, *args)
    assert out.returncode == 2
    assert out.stderr == message
    assert out.stdout == ""


def test_port_in_use_is_a_clear_error(ddpstore, tmp_path):
    with ddpstore_running(ddpstore, tmp_path) as first:
        out = run(ddpstore, "--host", "127.0.0.1", "--port", str(first.port))
        assert out.returncode == 1
        assert out.stderr == (f"ddpstore: cannot listen on 127.0.0.1:{first.port}: "
                              "Address already in use\n")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serves_until_signalled_then_closes_connections(ddpstore, tmp_path, sig):
    store = Ddpstore(ddpstore, tmp_path)
    idle, parked = Conn(store.port), Conn(store.port)
    parked.send(op(V1, "WAIT", keys("/never")))
    idle.send(op(V1, "ADD", s("k"), i64(2)))
    assert idle.recv_i64() == 2
    assert store.stop(sig) == 0
    assert idle.closed_by_peer() and parked.closed_by_peer()
    name = "SIGTERM" if sig == signal.SIGTERM else "SIGINT"
    assert f"[ddpstore] stopping on {name}" in store.log_path.read_text()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", store.port), timeout=5)


def test_given_port_is_bound(ddpstore, tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([ddpstore, "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == f"[ddpstore] listening on 127.0.0.1:{port}\n"
        c = Conn(port)
        c.send(op(V1, "GETNUMKEYS"))
        assert c.recv_i64() == 0
    finally:
        proc.terminate()
        assert proc.wait(20) == 0
