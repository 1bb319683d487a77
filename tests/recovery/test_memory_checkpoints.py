"""In-memory checkpoints (--memory-checkpoints, the Python `ddprun` module): a job that saves
every step and loses a rank resumes from memory at the step that was running and ends with an
undisturbed run's parameters, under torch 1.13 and 2.x; a save torn by a kill is never restored;
the bound is kept; the directory is private to the job and goes with it, even when ddprun is
SIGKILLed; outside ddprun the module does nothing; its heartbeat() reaches hang detection."""
import json
import os
import shutil
import subprocess
import tempfile

import pytest
from conftest import SOURCE_DIR, TORCH1_PYTHON, TORCH2_PYTHON, wait_for
from jobs import kill_tree

MODULE = SOURCE_DIR / "worker-sdk" / "python"
TRAIN = SOURCE_DIR / "tests" / "recovery" / "memory_train.py"
PYTHONS = {"torch1": TORCH1_PYTHON, "torch2": TORCH2_PYTHON}


def env(python, **extra):
    """The workers' interpreter, the module from the source tree, nothing of an outer job."""
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("PET_", "TORCHELASTIC_", "MASTER_", "DDPRUN_"))
         and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    e.update(PYTHON_EXEC=python, PYTHONPATH=str(MODULE), OMP_NUM_THREADS="1",
             PYTHONDONTWRITEBYTECODE="1", **extra)
    return e


def ddprun_run(ddprun, python, args, cwd, timeout=240, **extra):
    return subprocess.run([ddprun, "--standalone", "--nproc-per-node=2", *map(str, args)],
                          cwd=cwd, env=env(python, **extra), capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("torch", ["torch1", "torch2"])
def test_a_killed_rank_resumes_from_memory_at_the_step_it_was_in(ddprun, tmp_path, torch):
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    whole.mkdir()
    broken.mkdir()
    r = ddprun_run(ddprun, PYTHONS[torch], [TRAIN, whole], tmp_path)
    assert r.returncode == 0, r.stderr
    r = ddprun_run(ddprun, PYTHONS[torch], ["--max-restarts=1", TRAIN, broken, "--kill-at", 25],
                   tmp_path)
    assert r.returncode == 0, r.stderr
    assert "SIGKILL" in r.stderr, r.stderr
    undisturbed = json.loads((whole / "attempt0.json").read_text())
    resumed = json.loads((broken / "attempt1.json").read_text())
    assert not (broken / "attempt0.json").exists()
    # Rank 1 died entering step 25: step 24's save is the last, unless rank 0 was still writing
    # it when the agent stopped it (that torn save is dropped and step 24 is done again).
    assert resumed["resumed_at"] in (24, 25), resumed
    assert resumed["params"] == undisturbed["params"]
    assert resumed["memory"].startswith("/dev/shm/ddprun-")
    assert not os.path.exists(resumed["memory"])  # the job's memory went with it


TORN = r"""
import os, signal, threading, time, json, sys
import torch, ddprun
out = sys.argv[1]
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
if os.environ["RANK"] != "0":
    sys.exit(0)
d = os.environ["DDPRUN_MEMORY_CHECKPOINT_DIR"]
if attempt == "0":
    ddprun.save_checkpoint({"version": 1, "weights": torch.arange(10.0)})
    temp = os.path.join(d, f".checkpoint.{os.getpid()}.tmp")
    def kill_mid_save():  # once the second save has written some of its bytes
        while not (os.path.exists(temp) and os.stat(temp).st_size > 1 << 20):
            time.sleep(0.0005)
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=kill_mid_save, daemon=True).start()
    ddprun.save_checkpoint({"version": 2, "weights": torch.zeros(200 * 2**20 // 4)})
    time.sleep(30)  # not reached: the kill comes during the save
else:
    state = ddprun.load_checkpoint()
    with open(out, "w") as f:
        json.dump({"version": state["version"], "sum": float(state["weights"].sum()),
                   "left": sorted(os.listdir(d))}, f)
"""


def test_a_save_torn_by_a_kill_is_never_restored(ddprun, tmp_path):
    (tmp_path / "torn.py").write_text(TORN)
    out = tmp_path / "out.json"
    r = ddprun_run(ddprun, TORCH2_PYTHON, ["--max-restarts=1", "torn.py", out], tmp_path)
    assert r.returncode == 0, r.stderr
    seen = json.loads(out.read_text())
    assert seen == {"version": 1, "sum": 45.0, "left": ["checkpoint.pt"]}, seen


ROUND_TRIP = r"""
import collections, os, sys, torch, ddprun
shared = torch.arange(6.0).view(2, 3)
state = {"a": shared, "b": shared, "t": torch.arange(12).view(3, 4).t(),
         "bf16": torch.randn(5).bfloat16(), "bool": torch.tensor([True, False]),
         "scalar": torch.tensor(3.5), "empty": torch.empty(0, 4), "step": 7,
         "param": torch.nn.Parameter(torch.ones(2)), "grad": torch.ones(3, requires_grad=True),
         "od": collections.OrderedDict(x=1, y=[1, 2.5, "s", None, (1, 2)])}
assert ddprun.save_checkpoint(state, wait=True)
d = os.environ["DDPRUN_MEMORY_CHECKPOINT_DIR"]
print("format", open(os.path.join(d, "checkpoint.pt"), "rb").read(12).decode())
back = ddprun.load_checkpoint()
for k, v in state.items():
    w = back[k]
    if isinstance(v, torch.Tensor):
        assert type(w) is type(v) and w.dtype == v.dtype and w.shape == v.shape, k
        assert torch.equal(w.detach(), v.detach()) and w.requires_grad == v.requires_grad, k
    else:
        assert type(w) is type(v) and w == v, k
assert back["a"] is back["b"]  # one tensor saved twice is one tensor again
back["a"].add_(1)  # the loaded tensors are writable, the save unchanged
assert ddprun.load_checkpoint()["a"].sum().item() == 15
ddprun.save_checkpoint({"sparse": torch.eye(3).to_sparse()}, "other", wait=True)
print("fallback", open(os.path.join(d, "other.pt"), "rb").read(2).decode(),
      ddprun.load_checkpoint("other")["sparse"].to_dense().sum().item())
for v in (2.0, 3.0, 4.0):  # the third writes over the first's file, from its start
    ddprun.save_checkpoint({"sparse": (torch.eye(3) * v).to_sparse()}, "other")
print("fallback again", ddprun.load_checkpoint("other")["sparse"].to_dense().sum().item())
class Custom: pass
ddprun.save_checkpoint({"custom": Custom(), "t": torch.ones(1)}, "custom")
try:
    ddprun.load_checkpoint("custom", weights_only=True)
    print("custom loaded")
except Exception as e:
    print("custom refused:", type(e).__name__)
print("trusted", type(ddprun.load_checkpoint("custom", weights_only=False)["custom"]).__name__)
print("left", sorted(f for f in os.listdir(d) if not f.startswith(".")))  # but spares
"""


# Plain dense tensors are written raw (one copy, no pickling of their bytes), anything else with
# torch.save; either comes back as saved, and weights_only keeps code out of a load.
@pytest.mark.parametrize("torch", ["torch1", "torch2"])
def test_what_a_save_holds_comes_back(torch, tmp_path):
    memory = tmp_path / "memory"
    memory.mkdir()
    (tmp_path / "round_trip.py").write_text(ROUND_TRIP)
    r = subprocess.run([PYTHONS[torch], "round_trip.py"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120,
                       env=env(PYTHONS[torch], DDPRUN_MEMORY_CHECKPOINT_DIR=str(memory)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "format DDPRUN-CKPT1", "fallback PK 3.0", "fallback again 12.0",
        "custom refused: UnpicklingError",
        "trusted Custom", "left ['checkpoint.pt', 'custom.pt', 'other.pt']"], r.stdout


REUSE = r"""
import fcntl, os, sys, torch, ddprun
d = os.environ["DDPRUN_MEMORY_CHECKPOINT_DIR"]
final = os.path.join(d, "checkpoint.pt")
temp = os.path.join(d, f".checkpoint.{os.getpid()}.tmp")
ino = lambda path: os.stat(path).st_ino
save = lambda v: ddprun.save_checkpoint({"v": v, "w": torch.full((2**18,), float(v))})
save(1)
first = ino(final)
save(2)
print("previous save kept as the temp file:", ino(temp) == first)
save(3)
print("third save in the first one's file:", ino(final) == first)
# A reader holding a shared flock (as the agent does while it sends a save to another node)
# keeps its file: the save that would write over it gets a new file.
fd = os.open(final, os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_SH)
held = os.pread(fd, 2**21, 0)
save(4)
save(5)
print("held file unchanged:", os.pread(fd, 2**21, 0) == held, ino(final) != os.fstat(fd).st_ino)
os.close(fd)
print("newest:", ddprun.load_checkpoint()["v"], float(ddprun.load_checkpoint()["w"][0]))
# A temp file that is not the one this process left there is written over as it is found,
# and the file the process held is not swapped in.
os.unlink(temp)
with open(temp, "wb") as f:
    f.write(b"not a save")
save(8)
print("temp file replaced:", ddprun.load_checkpoint()["v"], float(ddprun.load_checkpoint()["w"][-1]))
# A forked child (a DataLoader worker, say) that saves uses files of its own.
state = {"v": 9, "w": torch.full((2**18,), 9.0)}
pid = os.fork()
if pid == 0:
    ddprun.save_checkpoint(state)
    os.unlink(os.path.join(d, f".checkpoint.{os.getpid()}.tmp"))
    os._exit(0)
os.waitpid(pid, 0)
print("child's save:", ddprun.load_checkpoint()["v"])
save(10)
save(11)
print("after the child:", ddprun.load_checkpoint()["v"], float(ddprun.load_checkpoint()["w"][0]))
# Where the bound has no room for the previous save too, each save makes a new file.
size = os.stat(final).st_blocks * 512
os.environ["DDPRUN_MEMORY_CHECKPOINT_LIMIT"] = str(size + size // 2)
os.unlink(temp)
save(6)
save(7)
print("bounded:", sorted(os.listdir(d)), ddprun.load_checkpoint()["v"])
"""


# A save writes over the pages of the save before the last (they cost more to get than the copy
# into them), never over a file that a reader holds, and only where the bound has room; what
# the process holds open between saves is checked against what is in the directory.
@pytest.mark.parametrize("torch", ["torch1", "torch2"])
def test_saves_reuse_the_previous_saves_memory(torch, tmp_path):
    (tmp_path / "reuse.py").write_text(REUSE)
    # Not "ddprun-...": an agent of a test beside this one removes such directories nobody locks.
    memory = tempfile.mkdtemp(prefix="reuse-test-", dir="/dev/shm")
    try:
        r = subprocess.run([PYTHONS[torch], "reuse.py"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120,
                           env=env(PYTHONS[torch], DDPRUN_MEMORY_CHECKPOINT_DIR=memory))
    finally:
        shutil.rmtree(memory)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "previous save kept as the temp file: True", "third save in the first one's file: True",
        "held file unchanged: True True", "newest: 5 5.0", "temp file replaced: 8 8.0",
        "child's save: 9", "after the child: 11 11.0", "bounded: ['checkpoint.pt'] 7"], r.stdout


FULL = r"""
import os, torch, ddprun
d = os.environ["DDPRUN_MEMORY_CHECKPOINT_DIR"]
ddprun.save_checkpoint({"v": 1, "w": torch.ones(80_000)})  # 320 KB of a 400 KB tmpfs
try:
    ddprun.save_checkpoint({"v": 2, "w": torch.ones(80_000)})  # a second file: no room
    print("saved")
except OSError as e:
    print("refused:", "no memory for this save" in str(e))
print("kept:", ddprun.load_checkpoint()["v"], sorted(os.listdir(d)))
"""


# A save is copied into mapped pages; a tmpfs without room for them fails that save with an
# error (the pages are got first) and keeps the previous one, where a fault in the copy would
# kill the worker with SIGBUS.
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="mounts a tmpfs")
def test_a_full_tmpfs_fails_the_save_not_the_worker(tmp_path):
    (tmp_path / "full.py").write_text(FULL)
    memory = tmp_path / "memory"
    memory.mkdir()
    python = TORCH2_PYTHON
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                        f'mount -t tmpfs -o size=400k tmpfs "{memory}" && exec "{python}" full.py'],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env=env(python, DDPRUN_MEMORY_CHECKPOINT_DIR=str(memory)))
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert r.stdout.splitlines() == ["refused: True", "kept: 1 ['checkpoint.pt']"], r.stdout


BOUNDED = r"""
import os, sys, torch, ddprun
if os.environ["RANK"] == "0":
    ddprun.save_checkpoint({"small": torch.zeros(1000)}, "state")
    try:
        ddprun.save_checkpoint({"large": torch.zeros(2 * 2**20)}, "state")  # 8 MiB
    except ddprun.CheckpointLimitError as e:
        print("refused:", e, flush=True)
    print("kept:", sorted(ddprun.load_checkpoint("state")), flush=True)
    try:
        ddprun.save_checkpoint({}, "../escape")
    except ValueError as e:
        print("bad name:", e, flush=True)
"""


def test_the_bound_is_kept_and_names_stay_inside(ddprun, tmp_path):
    (tmp_path / "bounded.py").write_text(BOUNDED)
    r = ddprun_run(ddprun, TORCH2_PYTHON, ["--memory-checkpoints=1M", "bounded.py"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "refused: in-memory checkpoint 'state'" in r.stdout, r.stdout
    assert "raise ddprun --memory-checkpoints" in r.stdout
    assert "kept: ['small']" in r.stdout
    assert "bad name: checkpoint name '../escape'" in r.stdout


PROBE = r"""
import os, stat, sys, torch, ddprun
d = ddprun.memory_checkpoint_dir()
mode = oct(stat.S_IMODE(os.stat(d).st_mode)) if d else None
print(f"rank {os.environ.get('RANK')} dir {d} mode {mode} "
      f"saved {ddprun.save_checkpoint({'x': torch.ones(1)})} "
      f"loaded {ddprun.load_checkpoint() is not None}", flush=True)
ddprun.heartbeat()
if d and os.environ.get("PROBE_DIR_FILE"):
    open(os.environ["PROBE_DIR_FILE"], "w").write(d)
if len(sys.argv) > 1:
    import time
    time.sleep(float(sys.argv[1]))
"""


def test_the_directory_is_private_and_off_means_none(ddprun, tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    r = ddprun_run(ddprun, TORCH1_PYTHON, ["probe.py"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "mode 0o700 saved True loaded True" in r.stdout, r.stdout
    r = ddprun_run(ddprun, TORCH1_PYTHON, ["--memory-checkpoints=off", "probe.py"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("dir None mode None saved False loaded False") == 2, r.stdout
    # Not under ddprun at all (plain python, or torchrun): nothing happens, nothing fails.
    plain = subprocess.run([TORCH1_PYTHON, "probe.py"], cwd=tmp_path, env=env(TORCH1_PYTHON),
                           capture_output=True, text=True, timeout=60)
    assert plain.returncode == 0, plain.stderr
    assert "dir None mode None saved False loaded False" in plain.stdout


def test_killing_ddprun_removes_the_jobs_memory(ddprun, tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    told = tmp_path / "dir"
    job = subprocess.Popen([ddprun, "--standalone", "--nproc-per-node=2", "probe.py", "60"],
                           cwd=tmp_path, env=env(TORCH1_PYTHON, PROBE_DIR_FILE=str(told)),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: told.exists() and told.read_text(), timeout=60), "no directory"
        memory = told.read_text()
        assert "checkpoint.pt" in os.listdir(memory)  # the probe's save
        job.kill()
        job.wait()
        assert wait_for(lambda: not os.path.exists(memory), timeout=10), memory
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


BEATING = r"""
import os, time, ddprun
for i in range(300):
    if os.environ["RANK"] == "0" or i < 10:  # rank 1 goes silent after a second: hung
        ddprun.heartbeat()
    time.sleep(0.1)
"""


def test_heartbeat_reaches_hang_detection(ddprun, tmp_path):
    (tmp_path / "beating.py").write_text(BEATING)
    r = ddprun_run(ddprun, TORCH1_PYTHON, ["--hang-timeout=1.5", "beating.py"], tmp_path,
                   timeout=120)
    assert r.returncode != 0
    assert "rank 1 (local rank 1, pid" in r.stderr and "hung: no heartbeat" in r.stderr, r.stderr


def test_memory_left_by_a_killed_process_tree_goes_with_the_next_job(ddprun, tmp_path):
    """ddprun, its guardian and its workers SIGKILLed together (a cgroup's OOM kill): nobody
    is left to remove the job's memory, so the next ddprun job of the user on the node does."""
    (tmp_path / "probe.py").write_text(PROBE)
    told = tmp_path / "dir"
    job = subprocess.Popen([ddprun, "--standalone", "--nproc-per-node=2", "probe.py", "60"],
                           cwd=tmp_path, env=env(TORCH1_PYTHON, PROBE_DIR_FILE=str(told)),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: told.exists() and told.read_text(), timeout=60), "no directory"
        memory = told.read_text()
        kill_tree(job)  # all frozen first: none of them may act on another's death
        job.wait()
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert os.path.isdir(memory)  # left behind
    told.unlink()
    r = ddprun_run(ddprun, TORCH1_PYTHON, ["probe.py"], tmp_path, PROBE_DIR_FILE=str(told))
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(memory)
