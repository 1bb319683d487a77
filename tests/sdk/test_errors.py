"""C++ workers report errors the torchelastic way: a clear message naming the bad variable, an
error file in torchelastic's format, and the launcher's failure summary showing the C++ error."""
import json
import os
import subprocess

from sdkutil import sdk_bin

CONTRACT = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "GROUP_RANK", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT"]


def run_train_directly(tmp_path, extra_env):
    env = {k: v for k, v in os.environ.items() if k not in CONTRACT}
    env.update(extra_env)
    env["TORCHELASTIC_ERROR_FILE"] = str(tmp_path / "attempt_0" / "0" / "error.json")
    r = subprocess.run([sdk_bin("train"), "--steps", "1", "--global-batch", "2"],
                       capture_output=True, text=True, timeout=60, env=env)
    return r, tmp_path / "attempt_0" / "0" / "error.json"


def test_missing_variable_is_named_and_recorded(tmp_path):
    r, error_file = run_train_directly(tmp_path, {})
    assert r.returncode == 1
    assert "environment variable WORLD_SIZE is not set" in r.stderr
    data = json.loads(error_file.read_text())
    message = data["message"]["message"]
    assert message.startswith("ddprun::Error: environment variable WORLD_SIZE is not set")
    info = data["message"]["extraInfo"]
    assert info["timestamp"].isdigit()
    assert "WORLD_SIZE is not set" in info["py_callstack"]


def test_malformed_variable_is_named(tmp_path):
    r, error_file = run_train_directly(tmp_path, {
        "RANK": "zero", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500"})
    assert r.returncode == 1
    assert 'environment variable RANK="zero" is not an integer' in r.stderr
    assert 'RANK=\\"zero\\"' in error_file.read_text()


def test_launcher_summary_shows_the_cpp_error(launcher):
    # NCCL needs a GPU per worker (or a CUDA LibTorch): fails the same way on every rank here.
    r = launcher.run(2, [sdk_bin("train"), "--steps", "2", "--global-batch", "4",
                         "--backend", "nccl"])
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    files = list(launcher.log_dir.rglob("error.json"))
    assert files, f"no error.json under {launcher.log_dir}\n{out}"
    data = json.loads(files[0].read_text())
    assert data["message"]["message"].startswith("ddprun::Error: backend nccl")
    assert "ddprun::Error: backend nccl" in out
