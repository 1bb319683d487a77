"""What scripts/package makes, used as a user would: the static ddprun and ddpstore in a bare
chroot (no libc, no NSS, only /etc/hosts), the wheel pip-installed in a fresh virtualenv next
to torch 2.x running a real gloo job, and the .deb unpacked and used by a find_package(ddprun)
project. scripts/package runs once for the module; its static build lives in the build tree."""
import contextlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from conftest import SOURCE_DIR, TORCH1_PYTHON, TORCH2_PYTHON

sys.path.insert(0, str(SOURCE_DIR / "tests" / "store"))
from store_helpers import V1, Conn, i64, op, s  # noqa: E402

BUILD_DIR = pathlib.Path(os.environ.get("DDPRUN_BUILD_DIR", SOURCE_DIR / "build"))
VERSION = re.search(r"project\(ddprun VERSION ([0-9.]+)",
                    (SOURCE_DIR / "CMakeLists.txt").read_text()).group(1)

# A worker that needs no libc at run time either: reports its rank and exits.
WORKER_C = r"""
#include <stdio.h>
#include <stdlib.h>
int main(void) {
  printf("worker rank %s of %s\n", getenv("RANK"), getenv("WORLD_SIZE"));
  return 0;
}
"""


def run(cmd, timeout=120, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                       **kw)
    assert r.returncode == 0, f"{cmd}\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    run([SOURCE_DIR / "scripts" / "package", "--build-dir", BUILD_DIR / "package",
         "--sdk-build", BUILD_DIR, "--dist", out, "--jobs", "2"], timeout=1500)
    return out


@pytest.fixture
def chroot(dist, tmp_path):
    """A root holding only the two programs, a static worker, /etc/hosts and mount points."""
    root = tmp_path / "root"
    for d in ("etc", "proc", "dev", "tmp"):
        (root / d).mkdir(parents=True)
    (root / "dev" / "null").touch()
    (root / "etc" / "hosts").write_text("127.0.0.1 localhost\n127.0.0.1 storehost\n")
    for name in ("ddprun", "ddpstore"):
        shutil.copy2(dist / name, root / name)
    (tmp_path / "worker.c").write_text(WORKER_C)
    run(["cc", "-static", "-O2", "-o", root / "worker", tmp_path / "worker.c"])
    return root


def in_chroot(root, *argv):
    """The command line that runs argv in root, with /proc and /dev/null mounted in a mount
    namespace of its own: the mounts vanish with the process, whatever happens to the test."""
    script = ('mount -t proc proc "$0/proc" && mount --bind /dev/null "$0/dev/null" && '
              'exec chroot "$0" "$@"')
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(root),
            *argv]


@contextlib.contextmanager
def store_in_chroot(root):
    """ddpstore bound to a name only the chroot's /etc/hosts knows; yields its port."""
    proc = subprocess.Popen(in_chroot(root, "/ddpstore", "--host", "storehost", "--port", "0"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            m = re.search(r"listening on storehost:(\d+)", line)
            if m:
                yield int(m.group(1))
                break
        else:
            pytest.fail("ddpstore did not start:\n" + "".join(lines))
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def test_programs_are_static(dist):
    for name in ("ddprun", "ddpstore"):
        path = dist / name
        assert os.access(path, os.X_OK)
        assert "statically linked" in run(["file", path]).stdout
        ldd = subprocess.run(["ldd", path], capture_output=True, text=True)
        assert "not a dynamic executable" in ldd.stdout + ldd.stderr
    assert VERSION in run([dist / "ddprun", "--version"]).stdout


def test_ddpstore_serves_in_a_bare_chroot(chroot):
    with store_in_chroot(chroot) as port:
        conn = Conn(port)
        conn.send(op(V1, "ADD", s("counter"), i64(5)))
        assert conn.recv_i64() == 5
        conn.send(op(V1, "ADD", s("counter"), i64(2)))
        assert conn.recv_i64() == 7


def test_ddprun_runs_workers_in_a_bare_chroot(chroot):
    r = run(in_chroot(chroot, "/ddprun", "--nproc-per-node", "2", "--no-python", "/worker"),
            timeout=60)
    assert "worker rank 0 of 2" in r.stdout and "worker rank 1 of 2" in r.stdout, r.stderr
    # c10d rendezvous on a store whose host name comes from the chroot's /etc/hosts.
    with store_in_chroot(chroot) as port:
        r = run(in_chroot(chroot, "/ddprun", "--nnodes", "1", "--nproc-per-node", "2",
                          "--rdzv-backend", "c10d", "--rdzv-endpoint", f"storehost:{port}",
                          "--no-python", "/worker"), timeout=60)
    assert "worker rank 0 of 2" in r.stdout and "worker rank 1 of 2" in r.stdout, r.stderr
    assert not list((chroot / "tmp").iterdir())  # ddprun removed its log directory


def test_wheel_puts_ddprun_on_a_fresh_venv_path_and_runs_torch2_workers(dist, tmp_path):
    wheels = list(dist.glob(f"ddprun-{VERSION}-py3-none-*manylinux_2_17_x86_64*.whl"))
    assert len(wheels) == 1, list(dist.iterdir())
    venv = tmp_path / "venv"
    run([TORCH2_PYTHON, "-m", "venv", venv])
    # torch 2.x comes from scripts/setup's virtualenv (a download is too slow for a test).
    torch_site = run([TORCH2_PYTHON, "-c", "import torch, os; "
                      "print(os.path.dirname(os.path.dirname(torch.__file__)))"]).stdout.strip()
    site = run([venv / "bin" / "python", "-c", "import sysconfig; "
                "print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    pathlib.Path(site, "torch2-venv.pth").write_text(torch_site + "\n")
    run([venv / "bin" / "python", "-m", "pip", "install", "--no-index", "--no-deps",
         "--disable-pip-version-check", "-q", wheels[0]])

    # The user's shell with the virtualenv activated: its bin/ first, no build tree anywhere.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "TORCHELASTIC_", "MASTER_", "PYTHON"))
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv / 'bin'}:/usr/bin:/bin", VIRTUAL_ENV=str(venv),
               PYTHONDONTWRITEBYTECODE="1")
    for name in ("ddprun", "ddpstore"):
        assert shutil.which(name, path=env["PATH"]) == str(venv / "bin" / name)
        assert os.access(venv / "bin" / name, os.X_OK)
    out = tmp_path / "report.json"
    r = subprocess.run(["ddprun", "--standalone", "--nproc-per-node", "2",
                        str(SOURCE_DIR / "examples" / "python" / "ddp_gloo.py"), "--out", str(out)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    # The workers' module came with it: a save to the job's memory and a load.
    saver = tmp_path / "saver.py"
    saver.write_text("import ddprun, torch\n"
                     "assert ddprun.save_checkpoint({'w': torch.ones(3)}, 'c')\n"
                     "print('module', ddprun.__file__, float(ddprun.load_checkpoint('c')['w'].sum()))\n")
    r = subprocess.run(["ddprun", "--standalone", "--nproc-per-node", "1", str(saver)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"module {venv}" in r.stdout and r.stdout.strip().endswith(" 3.0"), r.stdout
    report = json.loads(out.read_text())
    assert report["world_size"] == 2 and report["rank_sum"] == 3.0
    assert report["torch"].startswith("2.")


def test_deb_unpacks_and_builds_a_find_package_project(dist, tmp_path):
    debs = list(dist.glob(f"ddprun_{VERSION}_amd64.deb"))
    assert len(debs) == 1, list(dist.iterdir())
    deb = debs[0]
    info = run(["dpkg-deb", "-I", deb]).stdout
    fields = dict(re.findall(r"^ ([A-Z][\w-]*): (.*)$", info, re.M))
    assert fields["Package"] == "ddprun" and fields["Version"] == VERSION
    assert fields["Architecture"] == "amd64" and "@" in fields["Maintainer"]
    assert "Depends" not in fields  # the programs are static
    assert "libtorch-dev" in fields["Recommends"]
    listing = run(["dpkg-deb", "-c", deb]).stdout
    for path in ("./usr/bin/ddprun", "./usr/bin/ddpstore", "./usr/include/ddprun/ddp.hpp",
                 "./usr/lib/libddprun_sdk.a", "./usr/lib/cmake/ddprun/ddprunConfig.cmake",
                 "./usr/lib/cmake/ddprun/ddprunTargets.cmake",
                 "./usr/lib/python3/dist-packages/ddprun/__init__.py",
                 "./usr/lib/python3/dist-packages/ddprun/checkpoint.py",
                 "./usr/lib/python3/dist-packages/ddprun/_raw_format.py",
                 "./usr/lib/python3/dist-packages/ddprun/flight_recorder.py",
                 "./usr/share/doc/ddprun/README.md",
                 "./usr/share/doc/ddprun/docs/hangs-health-events.md",
                 "./usr/share/doc/ddprun/agent/ENVIRONMENT.md",
                 "./usr/share/doc/ddprun/tests/bench/README.md"):
        assert re.search(rf"^-rw\S+ .* {re.escape(path)}$", listing, re.M) or \
            re.search(rf"^-rwx\S+ .* {re.escape(path)}$", listing, re.M), path

    root = tmp_path / "root"
    run(["dpkg-deb", "-x", deb, root])
    ddprun = root / "usr" / "bin" / "ddprun"
    assert VERSION in run([ddprun, "--version"]).stdout
    site = root / "usr" / "lib" / "python3" / "dist-packages"
    r = run([TORCH1_PYTHON, "-c", "import ddprun; print(ddprun.__file__, ddprun.load_checkpoint())"],
            env={**os.environ, "PYTHONPATH": str(site)})
    assert r.stdout.split() == [str(site / "ddprun" / "__init__.py"), "None"], r.stdout
    build = tmp_path / "build"
    run(["cmake", "-S", SOURCE_DIR / "tests" / "sdk" / "consumer", "-B", build, "-G", "Ninja",
         "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_PREFIX_PATH={root / 'usr'}"])
    cache = (build / "CMakeCache.txt").read_text()
    assert f"ddprun_DIR:PATH={root / 'usr' / 'lib' / 'cmake' / 'ddprun'}" in cache
    run(["cmake", "--build", build, "-j", "2"], timeout=900)
    r = run([ddprun, "--standalone", "--nproc-per-node", "2", "--log-dir", tmp_path / "logs",
             "--no-python", build / "my_ddp_job"], timeout=180,
            env={**os.environ, "OMP_NUM_THREADS": "1"})
    out = r.stdout + r.stderr
    assert "rank 0 of 2 done" in out and "rank 1 of 2 done" in out
