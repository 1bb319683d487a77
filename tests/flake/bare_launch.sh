#!/usr/bin/env bash
# The "no launcher" control of study.sh: starts NPROC copies of a Python script with the env://
# variables set by hand (rank 0's torch TCPStore is the store, as in a plain
# init_process_group without torchrun), each in its own session, and waits for all of them.
#
#   bare_launch.sh NPROC SCRIPT.py [ARGS...]
#
# Runs $PYTHON_EXEC (default python3) -u SCRIPT.py ARGS. OMP_NUM_THREADS=1 unless set, as both
# launchers do for more than one worker. For every worker killed by a signal N it prints
# "[bare] rank R exitcode  : -N" to stderr (the form the launchers' failure summaries use), and
# it exits with the first failed worker's status (128 + N for a signal), else 0.
set -u
nproc=$1; shift
python=${PYTHON_EXEC:-python3}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=$nproc LOCAL_WORLD_SIZE=$nproc
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
pids=()
for ((r = 0; r < nproc; r++)); do
  RANK=$r LOCAL_RANK=$r setsid "$python" -u "$@" &
  pids+=($!)
done
trap 'kill -TERM "${pids[@]}" 2>/dev/null' TERM INT
status=0
for ((r = 0; r < nproc; r++)); do
  wait "${pids[$r]}"
  s=$?
  if ((s > 128)); then echo "[bare] rank $r exitcode  : -$((s - 128))" >&2; fi
  if ((s != 0 && status == 0)); then status=$s; fi
done
exit "$status"
