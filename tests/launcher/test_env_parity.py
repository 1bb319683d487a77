"""The environment (and argv) ddprun gives its workers equals torchrun's, checked by running
examples/python/env_dump.py under both with the same flags: Debian's torchrun 1.13 (with its
--redirects 1 --tee 1 --log_dir workaround for Python 3.11) and torch 2.x's torchrun.

Variables whose values legitimately differ between two runs (MASTER_PORT, the run id, the
error file's random directory) are compared by shape."""
import json
import re

from launcher_helpers import DDPRUN_ONLY_ENV, clean_env, example, free_port, run

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
# torch 1.13 names NCCL's variable without the TORCH_ prefix; torch 2.x with it and also
# exports TORCHELASTIC_SIGNALS_TO_HANDLE. ddprun sets all three (agent/ENVIRONMENT.md), and
# its own (DDPRUN_ONLY_ENV).
OURS_ONLY = set(DDPRUN_ONLY_ENV)
ONLY_TORCH2 = {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCHELASTIC_SIGNALS_TO_HANDLE"} | OURS_ONLY
ONLY_TORCH1 = {"NCCL_ASYNC_ERROR_HANDLING"} | OURS_ONLY


def launch(cmd, flags, tmp_path, name, python, nproc=2):
    out = tmp_path / name
    out.mkdir()
    logs = tmp_path / f"{name}_logs"
    env = clean_env(python=python)
    r = run([*cmd, f"--nproc_per_node={nproc}", *flags, "--log_dir", logs,
             example("env_dump.py"), out, "--arg", "${local_rank}", "x$${local_rank}"],
            env=env, timeout=180)
    assert r.returncode == 0, r.stderr
    dumps = {}
    for rank in range(nproc):
        d = json.loads((out / f"env_{rank}.json").read_text())
        d["added"] = {k: v for k, v in d["env"].items() if env.get(k) != v}
        d["argv"][1] = "<out>"
        dumps[rank] = d
    return dumps, logs


def check_error_file(value, logs, run_id, rank):
    assert re.fullmatch(re.escape(str(logs)) + "/" + re.escape(run_id) +
                        rf"_[a-z0-9_]{{8}}/attempt_0/{rank}/error\.json", value), value


def compare(ours, theirs, ours_logs, theirs_logs, extra_ours, same_port, use_agent_store_theirs):
    for rank in ours:
        a, b = ours[rank]["added"], theirs[rank]["added"]
        assert ours[rank]["argv"] == theirs[rank]["argv"]
        assert set(a) == set(b) | extra_ours, (set(a) ^ (set(b) | extra_ours))
        for k in sorted(b):
            if k == "MASTER_PORT" and not same_port:
                assert int(a[k]) > 0 and int(b[k]) > 0
            elif k == "TORCHELASTIC_RUN_ID" and b[k] != "none":
                assert UUID.match(a[k]) and UUID.match(b[k])
            elif k == "TORCHELASTIC_ERROR_FILE":
                check_error_file(a[k], ours_logs, a["TORCHELASTIC_RUN_ID"], rank)
                check_error_file(b[k], theirs_logs, b["TORCHELASTIC_RUN_ID"], rank)
            elif k == "TORCHELASTIC_USE_AGENT_STORE":
                # ddprun always hosts the store; torchrun 1.13's c10d (standalone) makes worker
                # 0 host a second one instead (documented difference).
                assert a[k] == "True" and b[k] == use_agent_store_theirs
            else:
                assert a[k] == b[k], k
        # Every worker leads its own process group and session (torchrun 2.x's
        # start_new_session), so signals reach its children too.
        assert ours[rank]["pid"] == ours[rank]["pgid"] == ours[rank]["sid"]
    assert ours[0]["added"]["MASTER_PORT"] == ours[1]["added"]["MASTER_PORT"]


def test_standalone_matches_torchrun_1_13(ddprun, torchrun1, torch1_python, tmp_path):
    tee = ["--redirects", "1", "--tee", "1"]
    theirs, tl = launch(torchrun1, ["--standalone", *tee], tmp_path, "t1", torch1_python)
    ours, ol = launch([ddprun], ["--standalone", *tee], tmp_path, "d1", torch1_python)
    compare(ours, theirs, ol, tl, ONLY_TORCH2, same_port=False, use_agent_store_theirs="False")
    assert ours[1]["argv"][1:] == ["<out>", "--arg", "1", "x${local_rank}"]


def test_static_port_matches_torchrun_1_13(ddprun, torchrun1, torch1_python, tmp_path):
    flags = ["--redirects", "1", "--tee", "1", "--master_addr=127.0.0.1"]
    port = free_port()
    theirs, tl = launch(torchrun1, [*flags, f"--master_port={port}"], tmp_path, "t1",
                        torch1_python)
    ours, ol = launch([ddprun], [*flags, f"--master_port={port}"], tmp_path, "d1",
                      torch1_python)
    compare(ours, theirs, ol, tl, ONLY_TORCH2, same_port=True, use_agent_store_theirs="True")
    assert ours[0]["added"]["TORCHELASTIC_RUN_ID"] == "none"


def test_standalone_matches_torchrun_2(ddprun, torchrun2, torch2_python, tmp_path):
    theirs, tl = launch(torchrun2, ["--standalone"], tmp_path, "t2", torch2_python)
    ours, ol = launch([ddprun], ["--standalone"], tmp_path, "d2", torch2_python)
    compare(ours, theirs, ol, tl, ONLY_TORCH1, same_port=False, use_agent_store_theirs="True")


def test_default_and_virtual_local_rank_match_torchrun_2(ddprun, torchrun2, torch2_python,
                                                          tmp_path):
    # No rendezvous flags on one node: torchrun 2.x picks a free port (not 29500).
    flags = ["--virtual-local-rank", "--role=trainer", "--max-restarts=2"]
    theirs, tl = launch(torchrun2, flags, tmp_path, "t2", torch2_python, nproc=3)
    ours, ol = launch([ddprun], flags, tmp_path, "d2", torch2_python, nproc=3)
    compare(ours, theirs, ol, tl, ONLY_TORCH1, same_port=False, use_agent_store_theirs="True")
    assert ours[2]["added"]["LOCAL_RANK"] == "0"
    assert ours[2]["added"]["CUDA_VISIBLE_DEVICES"] == "2"
