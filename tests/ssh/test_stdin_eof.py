"""`ddprun --stop-on-stdin-eof` (what a launch over ssh gives every node): EOF on stdin stops
the job as SIGTERM does, and the workers never hold the ddprun's stdin. No ssh needed."""
import pathlib
import subprocess
import time

WORKER = str(pathlib.Path(__file__).parent / "workers" / "report.py")


def test_eof_on_stdin_stops_the_job_like_sigterm(ddprun, tmp_path, torch1_python):
    hold = tmp_path / "hold"
    hold.mkdir()
    p = subprocess.Popen([ddprun, "--stop-on-stdin-eof", "--standalone", "--nproc-per-node=2",
                          "--shutdown-timeout=5", WORKER, "--hold", str(hold)],
                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=open(tmp_path / "err", "w"), text=True, env={"PATH": "/usr/bin:/bin", "PYTHON_EXEC": torch1_python})
    try:
        deadline = time.monotonic() + 60
        while len(list(hold.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = [int(f.read_text()) for f in hold.iterdir()]
        assert len(pids) == 2
        for pid in pids:  # the workers' stdin is /dev/null, not the ddprun's pipe
            assert pathlib.Path(f"/proc/{pid}/fd/0").resolve() == pathlib.Path("/dev/null")
        p.stdin.write("ignored bytes\n")
        p.stdin.flush()
        time.sleep(0.3)
        assert p.poll() is None  # data is not EOF
        p.stdin.close()
        assert p.wait(30) == 143
        err = (tmp_path / "err").read_text()
        assert "stdin closed" in err and "received SIGTERM" in err
        for pid in pids:
            assert not pathlib.Path(f"/proc/{pid}").exists() or \
                "Z" in pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
