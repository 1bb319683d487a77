"""Ctrl-C (and SIGTERM) end ddprun at once while it waits for a rendezvous store that does not
answer: an address nothing routes to, a name that does not resolve, an etcd with no member up,
a static job's master that is not there. Before, the signal was acknowledged and then ignored
until join_timeout (600 s by default) ran out."""
import signal
import subprocess
import time

import pytest
from launcher_helpers import clean_env, free_port

UNROUTABLE = "10.255.255.1"  # reserved: no host answers, connects hang or fail, forever

CASES = {
    "c10d-unreachable": ["--nnodes=2", "--rdzv-backend=c10d",
                         f"--rdzv-endpoint={UNROUTABLE}:29400", "--rdzv-id=sig"],
    "c10d-unresolvable": ["--nnodes=2", "--rdzv-backend=c10d",
                          "--rdzv-endpoint=no-such-host.invalid:29400", "--rdzv-id=sig"],
    "etcd-no-member": ["--nnodes=2", "--rdzv-backend=etcd",
                       f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-id=sig"],
    "static-master-away": ["--nnodes=2", "--node-rank=1", f"--master-addr={UNROUTABLE}",
                           "--master-port=29500"],
}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("case", CASES)
def test_signal_ends_ddprun_while_the_store_does_not_answer(ddprun, tmp_path, case, sig):
    job = subprocess.Popen([ddprun, *CASES[case], "--nproc-per-node=1", "--log-dir",
                            str(tmp_path / "logs"), "--no-python", "/bin/true"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=clean_env())
    try:
        # No line says "still connecting": give it a moment to be inside the connect loop,
        # which lasts the whole join_timeout.
        time.sleep(1.0)
        assert job.poll() is None, job.communicate()
        began = time.monotonic()
        job.send_signal(sig)
        out, err = job.communicate(timeout=10)
        took = time.monotonic() - began
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 128 + sig, err
    assert f"received {signal.Signals(sig).name}" in err, err
    assert took < 3, f"{took:.1f} s to honour {signal.Signals(sig).name}:\n{err}"
