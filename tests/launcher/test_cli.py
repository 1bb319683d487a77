"""ddprun's command line: bad input exits 2 with one clear line and the usage having started
nothing; --help/--version; PET_* defaults; spellings; entrypoint rule; a busy port."""
import json
import os
import socket
import stat
import subprocess

import pytest

from launcher_helpers import clean_env, example, run


@pytest.fixture
def marker_script(tmp_path):
    """A script that leaves a file behind if anything ever runs it."""
    marker = tmp_path / "ran"
    script = tmp_path / "worker.py"
    script.write_text(f"open({str(marker)!r}, 'a').write('x')\n")
    return script, marker


BAD_CASES = [
    (["--nnodes=0"], "--nnodes=0: the number of nodes must be at least 1"),
    (["--nnodes=3:2"], "--nnodes=3:2: MIN must not exceed MAX"),
    (["--max_restarts=-1"], "--max_restarts=-1: must be 0 or more"),
    (["--max-restarts", "two"], "not an integer"),
    (["--redirects=0:9"], "per-rank map"),
    (["-r", "1:"], "per-rank map"),
    (["--tee=7"], "per-rank map"),
    (["--nproc_per_node=0"], "between 1 and"),
    (["--no_such_flag"], "unrecognized option --no_such_flag"),
    (["--standalone=yes"], "takes no value"),
    (["--local_ranks_filter=x"], "comma-separated list"),
    (["--signals_to_handle=SIGTERM,SIGBOGUS"], "not a signal name"),
    # Multi-node settings that cannot work (tests/multinode/ runs the ones that do).
    (["--nnodes=1:2"], "the static backend needs a fixed number of nodes"),
    (["--nnodes=2", "--node_rank=2"], "--node-rank=2 with --nnodes=2: expected 0 to 1"),
    (["--node_rank=1"], "--node-rank=1 with --nnodes=1: the only node has rank 0"),
    (["--nnodes=2", "--master_port=0"], "must agree on a fixed port"),
    (["--rdzv_backend=etcd"], "needs --rdzv-endpoint=HOST[:PORT][,HOST[:PORT]...]"),
    (["--rdzv_backend=etcd", "--rdzv_endpoint=h1,,h2"], "an empty endpoint"),
    (["--rdzv_backend=etcd-v2", "--rdzv_endpoint=h", "--rdzv_conf=cacert=/no/such/ca.pem"],
     "--rdzv-conf cacert=/no/such/ca.pem: No such file or directory"),
    (["--rdzv_backend=etcd", "--rdzv_endpoint=h", "--rdzv_conf=protocol=ftp"],
     "expected http or https"),
    (["--nnodes=2", "--rdzv_backend=c10d"], "needs --rdzv-endpoint=HOST[:PORT]"),
    (["--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=h", "--rdzv_conf=join_timeout=x"],
     "--rdzv-conf join_timeout=x: expected a number of seconds"),
    (["--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=h", "--local_addr=a b"],
     "an address has no spaces"),
    (["--run_path", "-m"], "--run-path runs a Python script"),
    (["--logs_specs=myplugin"], "--logs-specs loads a Python plugin into torchrun"),
    (["--print_completion=fish"], "expected bash, zsh or tcsh"),
    # One node refuses a value that several nodes would refuse.
    (["--rdzv_backend=c10d", "--rdzv_conf=join_timeout=abc"], "--rdzv-conf join_timeout=abc"),
    (["-m", "--no_python"], "cannot be used together"),
]


@pytest.mark.parametrize("flags,message", BAD_CASES,
                         ids=[" ".join(c[0]) for c in BAD_CASES])
def test_bad_flags_exit_2_with_one_line_and_start_nothing(ddprun, marker_script, flags, message):
    script, marker = marker_script
    r = run([ddprun, *flags, script], timeout=30)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 2, r.stderr
    assert lines[0].startswith("usage: ddprun")
    assert lines[1].startswith("ddprun: error: ") and message in lines[1], lines[1]
    assert r.stdout == ""
    assert not marker.exists()


def test_gpu_workers_without_a_gpu(ddprun, marker_script):
    if os.path.exists("/proc/driver/nvidia/gpus") and os.listdir("/proc/driver/nvidia/gpus"):
        pytest.skip("this machine has a GPU")
    script, marker = marker_script
    r = run([ddprun, "--nproc_per_node=gpu", script])
    assert r.returncode == 2
    assert "ddprun: error: --nproc-per-node=gpu: no CUDA GPU" in r.stderr
    assert not marker.exists()


@pytest.mark.parametrize("entry,message", [
    ("missing.py", "does not exist"),
    ("notexec", "is not executable"),
    ("no-such-program-anywhere", "was not found on PATH"),
    ("./no-such-program", "was not found"),
])
def test_missing_or_non_executable_entrypoint(ddprun, tmp_path, entry, message):
    (tmp_path / "notexec").write_text("echo hi\n")
    r = run([ddprun, "--nproc_per_node=2", entry], cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.splitlines()[-1].startswith("ddprun: error: ")
    assert message in r.stderr


def test_missing_entrypoint_and_bad_pet_variable(ddprun):
    r = run([ddprun, "--nproc_per_node=2"])
    assert r.returncode == 2 and "missing the entrypoint" in r.stderr
    r = run([ddprun, "x.py"], env=clean_env(PET_NNODES="0"))
    assert r.returncode == 2 and "PET_NNODES=0: the number of nodes must be at least 1" in r.stderr
    r = run([ddprun, "x.py"], env=clean_env(PET_STANDALONE="yes"))
    assert r.returncode == 2 and "PET_STANDALONE=yes" in r.stderr


def test_help_and_version(ddprun):
    r = run([ddprun, "--help"])
    assert r.returncode == 0 and r.stderr == ""
    for flag in ["--nnodes", "--nproc-per-node", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id",
                 "--rdzv-conf", "--standalone", "--max-restarts", "--monitor-interval",
                 "--start-method", "--role", "--module", "--no-python", "--run-path",
                 "--log-dir", "--redirects", "--tee", "--local-ranks-filter", "--node-rank",
                 "--master-addr", "--master-port", "--local-addr", "--signals-to-handle",
                 "--shutdown-timeout", "--virtual-local-rank", "PET_"]:
        assert flag in r.stdout, flag
    assert max(len(line) for line in r.stdout.splitlines()) <= 100
    r = run([ddprun, "--version"])
    assert r.returncode == 0 and r.stdout.startswith("ddprun ")


def dump_dir_ranks(path):
    return sorted(json.loads(p.read_text())["env"]["LOCAL_RANK"] for p in path.glob("env_*.json"))


def test_pet_variables_and_spellings_reach_the_workers(ddprun, tmp_path):
    out = tmp_path / "a"
    out.mkdir()
    r = run([ddprun, example("env_dump.py"), out],
            env=clean_env(PET_NPROC_PER_NODE="3", PET_STANDALONE="1", PET_ROLE="trainer"))
    assert r.returncode == 0, r.stderr
    assert dump_dir_ranks(out) == ["0", "1", "2"]
    env = json.loads((out / "env_2.json").read_text())["env"]
    assert env["ROLE_NAME"] == "trainer" and env["WORLD_SIZE"] == "3"
    # The command line wins over PET_*, in either spelling and either form.
    for i, flags in enumerate([["--nproc-per-node", "2"], ["--nproc_per_node=2"]]):
        out = tmp_path / f"b{i}"
        out.mkdir()
        r = run([ddprun, *flags, example("env_dump.py"), out],
                env=clean_env(PET_NPROC_PER_NODE="3"))
        assert r.returncode == 0, r.stderr
        assert dump_dir_ranks(out) == ["0", "1"]


def test_executables_run_directly_by_path_or_name(ddprun, tmp_path):
    prog = tmp_path / "bin" / "train"
    prog.parent.mkdir()
    prog.write_text('#!/bin/sh\necho "rank $RANK args $*" > "$OUT/r$RANK"\n')
    prog.chmod(prog.stat().st_mode | stat.S_IXUSR)
    env = clean_env(OUT=tmp_path, PATH=f"{prog.parent}:{os.environ['PATH']}")
    r = run([ddprun, "--nproc_per_node=2", "./bin/train", "--x", "${local_rank}"],
            env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "r1").read_text() == "rank 1 args --x 1\n"
    r = run([ddprun, "--nproc_per_node=2", "train", "y"], env=env, cwd="/")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "r0").read_text() == "rank 0 args y\n"
    r = run([ddprun, "--no_python", "--nproc_per_node=1", "sh", "-c", 'echo "$RANK" > "$OUT/sh"'],
            env=env)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "sh").read_text() == "0\n"


def test_module_entrypoint(ddprun, tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "main.py").write_text(
        "import os, sys\nopen(os.path.join(sys.argv[1], 'm' + os.environ['RANK']), 'w')"
        ".write(' '.join(sys.argv[1:]))\n")
    r = run([ddprun, "--nproc_per_node=2", "-m", "mypkg.main", tmp_path, "${local_rank}"],
            env=clean_env(PYTHONPATH=tmp_path))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "m1").read_text() == f"{tmp_path} 1"


def test_busy_fixed_port_is_a_clear_error(ddprun, marker_script):
    script, marker = marker_script
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run([ddprun, "--nproc_per_node=2", f"--master_port={port}", script])
    assert r.returncode == 1
    assert "cannot host the store" in r.stderr and str(port) in r.stderr
    assert "in use" in r.stderr
    assert not marker.exists()


def test_torchrun_usages_that_need_no_change(ddprun, marker_script):
    """torchrun 2.15 documents these; under ddprun they run the job as they do there."""
    script, marker = marker_script
    for flags in (["--run-path"], ["--logs-specs", "default"], ["--logs_specs=default"]):
        if marker.exists():
            marker.unlink()
        r = run([ddprun, "--standalone", "--nproc-per-node=1", *flags, script], timeout=60)
        assert r.returncode == 0, (flags, r.stderr)
        assert marker.exists(), flags


def test_bash_completion_completes_flags_and_values(ddprun):
    script = run([ddprun, "--print-completion", "bash"])
    assert script.returncode == 0 and script.stderr == ""

    def complete(*words):
        line = " ".join(words)
        r = subprocess.run(["bash", "-c", script.stdout + f"\nCOMP_WORDS=({line}); "
                            f"COMP_CWORD={len(words) - 1}; _ddprun; echo \"${{COMPREPLY[@]}}\""],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        return r.stdout.split()

    assert complete("ddprun", "--rdzv-b") == ["--rdzv-backend"]
    assert complete("ddprun", "--rdzv-backend", "e") == ["etcd", "etcd-v2", "etcd-v3"]
    assert complete("ddprun", "--start_method", "f") == ["fork", "forkserver"]
    for shell in ("zsh", "tcsh"):
        r = run([ddprun, f"--print-completion={shell}"])
        assert r.returncode == 0 and "--nproc-per-node" in r.stdout, shell

