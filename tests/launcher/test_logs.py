"""Logs: the <log_dir>/<run_id>_<random>/attempt_<N>/<local_rank>/ layout, redirects and tee
(per-rank maps too), torchrun's "[<role><local_rank>]:" console prefixes, whole lines only,
--local_ranks_filter, earlier attempts kept."""
import os
import pathlib
import re
import subprocess

import pytest

from launcher_helpers import clean_env, example, run

# Each worker prints LINES long lines in small pieces (no flush at line ends) to stdout and
# stderr, so a launcher that forwarded bytes as they come would cut and interleave lines.
CHATTY = r"""
import os, sys
rank = os.environ["RANK"]
for i in range(int(sys.argv[1])):
    line = f"rank {rank} line {i} " + "x" * (300 + i % 700) + "\n"
    for j in range(0, len(line), 97):
        sys.stdout.write(line[j:j + 97])
    sys.stderr.write(f"err {rank} {i}\n")
sys.stdout.write(f"unterminated {rank}")
"""
LINES = 400


def chatty(ddprun, tmp_path, *flags, nproc=2, lines=LINES):
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY)
    logs = tmp_path / "logs"
    r = run([ddprun, "--standalone", f"--nproc_per_node={nproc}", "--log_dir", logs, *flags,
             script, str(lines)])
    assert r.returncode == 0, r.stderr
    (run_dir,) = list(logs.iterdir())
    assert re.fullmatch(r"[0-9a-f-]{36}_[a-z0-9_]{8}", run_dir.name), run_dir.name
    return r, run_dir


def expected_stdout(rank, lines=LINES):
    return "".join(f"rank {rank} line {i} " + "x" * (300 + i % 700) + "\n" for i in range(lines)) \
        + f"unterminated {rank}"


def test_redirects_go_to_files_only(ddprun, tmp_path):
    r, run_dir = chatty(ddprun, tmp_path, "--redirects", "3")
    assert "rank 0 line" not in r.stdout and "err 0" not in r.stderr
    for rank in range(2):
        d = run_dir / "attempt_0" / str(rank)
        assert (d / "stdout.log").read_text() == expected_stdout(rank)
        assert (d / "stderr.log").read_text() == "".join(f"err {rank} {i}\n" for i in range(LINES))


def test_tee_prefixes_whole_lines_never_cut_or_interleaved(ddprun, tmp_path):
    r, run_dir = chatty(ddprun, tmp_path, "--tee", "3", "--role", "trainer", nproc=4)
    out_lines = r.stdout.splitlines()
    for rank in range(4):
        mine = [l for l in out_lines if l.startswith(f"[trainer{rank}]:")]
        assert "\n".join(mine) + "\n" == "".join(
            f"[trainer{rank}]:{l}\n" for l in expected_stdout(rank).split("\n")), rank
        assert (run_dir / "attempt_0" / str(rank) / "stdout.log").read_text() == \
            expected_stdout(rank)
    # Nothing but prefixed whole lines on stdout.
    pattern = re.compile(r"\[trainer(\d)\]:(rank (\d) line \d+ x+|unterminated (\d))")
    for line in out_lines:
        m = pattern.fullmatch(line)
        assert m and m.group(1) == (m.group(3) or m.group(4)), line[:120]
    err_lines = [l for l in r.stderr.splitlines() if not l.startswith("[ddprun]")]
    assert sorted(err_lines) == sorted(f"[trainer{rank}]:err {rank} {i}"
                                       for rank in range(4) for i in range(LINES))


def test_per_rank_maps_and_local_ranks_filter(ddprun, tmp_path):
    # rank 0: stdout tee'd, stderr to console; rank 1: stderr redirected, stdout to console.
    r, run_dir = chatty(ddprun, tmp_path, "--tee", "0:1", "--redirects", "1:2", lines=3)
    assert "[default0]:rank 0 line 0 " in r.stdout
    assert "\nrank 1 line 0 " in "\n" + r.stdout  # not redirected: straight to the console
    assert "err 0 0" in r.stderr and "err 1 0" not in r.stderr
    a0, a1 = run_dir / "attempt_0" / "0", run_dir / "attempt_0" / "1"
    assert (a0 / "stdout.log").exists() and not (a0 / "stderr.log").exists()
    assert (a1 / "stderr.log").exists() and not (a1 / "stdout.log").exists()

    (tmp_path / "f").mkdir()
    r, run_dir = chatty(ddprun, tmp_path / "f", "--tee", "3", "--local_ranks_filter", "1",
                        nproc=3, lines=3)
    assert "[default1]:rank 1 line 0" in r.stdout
    assert "[default0]" not in r.stdout + r.stderr and "[default2]" not in r.stdout + r.stderr
    for rank in range(3):  # the files still get everything
        assert (run_dir / "attempt_0" / str(rank) / "stdout.log").read_text() == \
            expected_stdout(rank, 3)

    # Without redirects the filtered-out ranks' output is dropped.
    (tmp_path / "g").mkdir()
    r, _ = chatty(ddprun, tmp_path / "g", "--local_ranks_filter=0", lines=2)
    assert "rank 0 line 1" in r.stdout and "rank 1" not in r.stdout


def test_prefix_template_and_duplicate_filters(ddprun, tmp_path):
    r, run_dir = chatty(ddprun, tmp_path, "-t", "1", "--log_line_prefix_template",
                        "<${role_name}|${rank}> ", "--duplicate_stdout_filters", "line 1 ,line 2 ",
                        lines=4)
    assert "<default|1> rank 1 line 3 " in r.stdout
    filtered = (run_dir / "attempt_0" / "filtered_stdout.log").read_text().splitlines()
    assert sorted(l.split(" x")[0] for l in filtered) == sorted(
        f"<default|{rank}> rank {rank} line {i}" for rank in range(2) for i in (1, 2))


def test_earlier_attempts_logs_are_kept(ddprun, tmp_path):
    logs = tmp_path / "logs"
    r = run([ddprun, "--standalone", "--nproc_per_node=2", "--max_restarts=1", "--log_dir", logs,
             "-r", "3", example("flaky_worker.py"), tmp_path / "log", "--fail-rank", "0"])
    assert r.returncode == 0, r.stderr
    (run_dir,) = list(logs.iterdir())
    for attempt in range(2):
        for rank in range(2):
            out = (run_dir / f"attempt_{attempt}" / str(rank) / "stdout.log").read_text()
            assert out == f"worker rank {rank} attempt {attempt}\n"
    assert "failing with exit code 3" in (run_dir / "attempt_0" / "0" / "stderr.log").read_text()


REMOVES_LOGS = r"""
import os, shutil, sys, time
# <TMPDIR>/ddprun_XXXXXX/<run_id>_<random>/attempt_<N>/<local_rank>/error.json
base = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.environ["TORCHELASTIC_ERROR_FILE"]))))
ready = os.path.join(sys.argv[1], "rank1_running")
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    if os.environ["RANK"] == "0":
        while not os.path.exists(ready):  # every log file of the attempt is open
            time.sleep(0.01)
        shutil.rmtree(base)  # as a tmp cleaner would
        sys.exit(1)
    open(ready, "w").close()
    time.sleep(60)
print("attempt", os.environ["TORCHELASTIC_RESTART_COUNT"], "logs in", base, flush=True)
"""


def test_a_removed_log_directory_is_recreated_at_the_next_restart(ddprun, tmp_path):
    script = tmp_path / "removes_logs.py"
    script.write_text(REMOVES_LOGS)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    r = run([ddprun, "--standalone", "--nproc_per_node=2", "--max_restarts=1", "--tee=1", script,
             tmp_path], env=clean_env(TMPDIR=tmp))
    assert r.returncode == 0, r.stderr
    m = re.search(r"warning: the log directory (\S+) was removed while the job ran: recreated it",
                  r.stderr)
    assert m, r.stderr
    assert m.group(1).startswith(str(tmp) + "/ddprun_")
    assert (pathlib.Path(m.group(1)) / "attempt_1" / "0" / "stdout.log").exists()
    assert "attempt 1 logs in" in r.stdout


LOUD = r"""
import sys
for i in range(40000):
    sys.stdout.write(f"line {i} " + "x" * 100 + "\n")
"""


def test_a_full_log_file_system_is_said_once(ddprun, tmp_path):
    """--tee on a file system that fills up: the job goes on, the console keeps every line,
    one warning names the file and the job summary says it is incomplete."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", small]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        script = tmp_path / "loud.py"
        script.write_text(LOUD)
        r = run([ddprun, "--standalone", "--nproc_per_node=1", "--tee=3", "--log_dir", small,
                 script])
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.count("[default0]:line ") == 40000  # the console has every line
        warnings = re.findall(r"warning: cannot write the log file (\S+/attempt_0/0/stdout\.log) "
                              r"\(No space left on device\): it is incomplete from here on; its "
                              r"lines still go to the console", r.stderr)
        assert len(warnings) == 1, r.stderr[-2000:]
        assert re.search(r"job summary: .*; 1 log file incomplete: \S+/stdout\.log \(No space "
                         r"left on device\)", r.stderr), r.stderr[-2000:]
    finally:
        subprocess.run(["umount", "-l", small])
