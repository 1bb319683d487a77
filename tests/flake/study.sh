#!/usr/bin/env bash
# Runs tests/flake/ddp_exit.py N times under ddprun and N times under torchrun, alternating,
# with the same launch line, and counts the runs whose workers abort at exit
# ("terminate called without an active exception") or fail otherwise.
#
#   tests/flake/study.sh N [--out DIR] [--nproc K] [--shape standalone|c10d] [--torch 2|1.13]
#                          [--teardown full|destroy|none] [--epochs E] [--cores]
#                          [--ddprun PATH] [--timeout S] [--sides LIST] [--summary-only]
#
# N                runs per launcher (2N runs in all); pair i starts with ddprun when i is even
# --out DIR        where the raw results go (default: a new mktemp -d directory)
# --nproc K        --nproc-per-node for both launchers (default 2)
# --shape          standalone: --standalone (default)
#                  c10d: --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT, PORT free per run
# --torch 2        torch 2.x from $TORCH2_VENV (default /root/.cache/ddprun/torch2-venv):
#                  its torchrun, and PYTHON_EXEC=its python for both launchers (default)
# --torch 1.13     /usr/bin/torchrun and /usr/bin/python3; both launchers also get
#                  --redirects 1 --tee 1 (Debian's torchrun 1.13 crashes with --redirects 0)
# --teardown       passed to ddp_exit.py (default full = ddp_gloo.py's teardown)
# --epochs E       passed to ddp_exit.py (default 2)
# --cores          ulimit -c unlimited for the launchers and workers (core files land in the
#                  run's directory, named by /proc/sys/kernel/core_pattern)
# --ddprun PATH    the ddprun binary (default /tmp/flake-ddprun, else build/bin/ddprun)
# --timeout S      a run still going after S seconds is SIGTERMed (and SIGKILLed 10 s later)
#                  and counted as a hang (default 180)
# --sides LIST     comma-separated, from ddprun, torchrun, bare (default ddprun,torchrun);
#                  bare = no launcher: tests/flake/bare_launch.sh starts the workers with the
#                  env:// variables set by hand (rank 0 hosts torch's own TCPStore). Run i
#                  starts with side number i mod (number of sides).
# --summary-only   do not run anything: print the table for an existing --out DIR
#
# touch DIR/STOP to end the study after the current pair; running it again with the same
# --out DIR appends to DIR/results.tsv and continues the numbering.
#
# Each run gets DIR/runs/<side>-<i>/ with stdout, stderr and the launcher's logs, and one line
# in DIR/results.tsv:
#   side  i  rc  terminate  signals  wall_s  class
# terminate: 1 if the run's stderr contains "terminate called"; signals: the signals that killed
# workers, from the failure summary's "exitcode : -N" lines (both launchers print it), "-" if
# none; class: ok | abort (terminate called, or a worker killed by SIGABRT) | fail (any other
# non-zero exit or killed worker) | hang.
# The table at the end has, per side, the counts and a 95% Wilson interval for the abort rate.
set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
script="$here/ddp_exit.py"

n=""
out=""
nproc=2
shape=standalone
torchv=2
teardown=full
epochs=2
cores=0
ddprun=""
timeout_s=180
summary_only=0
sides=ddprun,torchrun
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --nproc) nproc=$2; shift 2 ;;
    --shape) shape=$2; shift 2 ;;
    --torch) torchv=$2; shift 2 ;;
    --teardown) teardown=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --cores) cores=1; shift ;;
    --ddprun) ddprun=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --summary-only) summary_only=1; shift ;;
    --sides) sides=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "study.sh: unknown option $1" >&2; exit 2 ;;
    *) if [ -z "$n" ]; then n=$1; shift; else echo "study.sh: extra argument $1" >&2; exit 2; fi ;;
  esac
done

summarize() {
  python3 - "$1" <<'EOF'
import math, sys, collections
path = sys.argv[1] + "/results.tsv"
rows = [l.rstrip("\n").split("\t") for l in open(path) if l.strip() and not l.startswith("side\t")]

def wilson(k, n, z=1.96):
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))

by = collections.OrderedDict()
for side, i, rc, term, sigs, wall, cls in rows:
    by.setdefault(side, []).append((int(rc), int(term), sigs, float(wall), cls))
print(f"{'launcher':<10} {'runs':>5} {'ok':>5} {'abort':>6} {'fail':>5} {'hang':>5} "
      f"{'abort rate, 95% CI':<26} {'median s':>8}  rc values")
for side, rs in by.items():
    n = len(rs)
    cnt = collections.Counter(r[4] for r in rs)
    lo, hi = wilson(cnt["abort"], n)
    walls = sorted(r[3] for r in rs)
    med = walls[n // 2] if n % 2 else (walls[n // 2 - 1] + walls[n // 2]) / 2
    rcs = collections.Counter(r[0] for r in rs)
    rate = f"{100*cnt['abort']/n:.1f}% [{100*lo:.1f}, {100*hi:.1f}]%"
    print(f"{side:<10} {n:>5} {cnt['ok']:>5} {cnt['abort']:>6} {cnt['fail']:>5} {cnt['hang']:>5} "
          f"{rate:<26} {med:>8.2f}  " + ", ".join(f"{k}x{v}" for k, v in sorted(rcs.items())))
sides = list(by)
for x in range(len(sides)):
  for y in range(x + 1, len(sides)):
    # Two-sided Fisher exact test on the abort counts (is one launcher's rate different?).
    a = sum(r[4] == "abort" for r in by[sides[x]]); n1 = len(by[sides[x]])
    b = sum(r[4] == "abort" for r in by[sides[y]]); n2 = len(by[sides[y]])
    K, N = a + b, n1 + n2
    def hyp(x):
        return math.comb(K, x) * math.comb(N - K, n1 - x) / math.comb(N, n1)
    p0 = hyp(a)
    p = sum(hyp(x) for x in range(max(0, K - n2), min(K, n1) + 1) if hyp(x) <= p0 * (1 + 1e-9))
    print(f"Fisher exact test, abort counts {sides[x]} {a}/{n1} vs {sides[y]} {b}/{n2}: p = {min(1.0, p):.3g}")
bad = [r for r in rows if r[6] != "ok"]
if bad:
    print("non-ok runs: " + ", ".join(f"{r[0]}-{r[1]} ({r[6]}, rc {r[2]}, signals {r[4]})" for r in bad))
EOF
}

if [ "$summary_only" = 1 ]; then
  [ -n "$out" ] || { echo "study.sh: --summary-only needs --out DIR" >&2; exit 2; }
  summarize "$out"
  exit 0
fi
case "$n" in ''|*[!0-9]*) echo "usage: study.sh N [--out DIR] [options] (see --help)" >&2; exit 2 ;; esac

if [ -z "$ddprun" ]; then
  if [ -x /tmp/flake-ddprun ]; then ddprun=/tmp/flake-ddprun; else ddprun="$here/../../build/bin/ddprun"; fi
fi
ddprun=$(readlink -f "$ddprun")
[ -x "$ddprun" ] || { echo "study.sh: no ddprun at $ddprun" >&2; exit 2; }

case "$torchv" in
  2)
    venv=${TORCH2_VENV:-/root/.cache/ddprun/torch2-venv}
    export PATH="$venv/bin:$PATH"
    export PYTHON_EXEC="$venv/bin/python"   # both launchers start workers with it
    torchrun_bin="$venv/bin/torchrun"
    extra=()
    ;;
  1.13)
    export PYTHON_EXEC=/usr/bin/python3
    torchrun_bin=/usr/bin/torchrun
    extra=(--redirects 1 --tee 1)
    ;;
  *) echo "study.sh: --torch 2 or 1.13" >&2; exit 2 ;;
esac

[ -n "$out" ] || out=$(mktemp -d /tmp/flake-study.XXXXXX)
mkdir -p "$out/runs"
out=$(cd "$out" && pwd)
results="$out/results.tsv"
[ -s "$results" ] || printf 'side\ti\trc\tterminate\tsignals\twall_s\tclass\n' > "$results"
if [ "$cores" = 1 ]; then ulimit -c unlimited; fi

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

{
  echo "date: $(date -Is)"
  echo "host: $(uname -a)"
  echo "ddprun: $ddprun ($("$ddprun" --version 2>&1)), sha256 $(sha256sum "$ddprun" | cut -c1-16)"
  echo "torchrun: $torchrun_bin; PYTHON_EXEC=$PYTHON_EXEC ($("$PYTHON_EXEC" -c 'import torch; print(torch.__version__)' 2>/dev/null))"
  echo "args: sides=$sides n=$n nproc=$nproc shape=$shape torch=$torchv teardown=$teardown epochs=$epochs cores=$cores timeout=$timeout_s"
  echo "nice: $(nice); core limit: $(ulimit -c); core_pattern: $(cat /proc/sys/kernel/core_pattern 2>/dev/null)"
} > "$out/meta.txt.new"
cat "$out/meta.txt.new" >> "$out/meta.txt"   # a resumed study appends its own header
cat "$out/meta.txt.new"; rm -f "$out/meta.txt.new"

run_one() {  # side i
  local side=$1 i=$2 dir="$out/runs/$1-$2" cmd rc t0 t1 wall term sigs cls
  mkdir -p "$dir"
  case "$side" in
    ddprun|torchrun)
      if [ "$side" = ddprun ]; then cmd=("$ddprun"); else cmd=("$torchrun_bin"); fi
      case "$shape" in
        standalone) cmd+=(--standalone) ;;
        c10d) cmd+=(--rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$(free_port)" --rdzv-id "flake$i") ;;
        *) echo "study.sh: --shape standalone or c10d" >&2; exit 2 ;;
      esac
      cmd+=(--nproc-per-node "$nproc" --log-dir "$dir/logs" "${extra[@]}")
      ;;
    bare) cmd=("$here/bare_launch.sh" "$nproc") ;;
  esac
  t0=$(date +%s.%N)
  (cd "$dir" && exec timeout -k 10 "$timeout_s" "${cmd[@]}" \
     "$script" --teardown "$teardown" --epochs "$epochs" --out "$dir/rank0.json" \
     > "$dir/stdout" 2> "$dir/stderr" < /dev/null)
  rc=$?
  t1=$(date +%s.%N)
  wall=$(python3 -c "print(f'{$t1 - $t0:.2f}')")
  term=0; grep -q "terminate called" "$dir/stderr" "$dir/stdout" && term=1
  # "exitcode  : -6 (pid: 123)" in the failure summary of either launcher.
  sigs=$(grep -ohE 'exitcode *: *-[0-9]+' "$dir/stderr" "$dir/stdout" | grep -oE '[0-9]+$' | sort -n | uniq | paste -sd, -)
  [ -n "$sigs" ] || sigs=-
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then cls=hang
  elif [ "$term" = 1 ] || [[ ",$sigs," == *",6,"* ]]; then cls=abort
  elif [ "$rc" != 0 ] || [ "$sigs" != - ]; then cls=fail
  else cls=ok
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$side" "$i" "$rc" "$term" "$sigs" "$wall" "$cls" >> "$results"
  printf '%-8s %4s rc=%-3s terminate=%s signals=%-5s %6ss %s\n' "$side" "$i" "$rc" "$term" "$sigs" "$wall" "$cls"
}

IFS=, read -r -a side_list <<< "$sides"
for s in "${side_list[@]}"; do
  case "$s" in ddprun|torchrun|bare) ;; *) echo "study.sh: unknown side $s" >&2; exit 2 ;; esac
done
# Appending to an existing --out DIR continues its numbering.
last=$(tail -n +2 "$results" | cut -f2 | sort -n | tail -1)
if [ -n "$last" ]; then start=$((last + 1)); else start=0; fi
for ((i = start; i < start + n; i++)); do
  if [ -e "$out/STOP" ]; then echo "study.sh: $out/STOP exists, stopping before pair $i"; rm -f "$out/STOP"; break; fi
  for ((k = 0; k < ${#side_list[@]}; k++)); do
    run_one "${side_list[$(((i + k) % ${#side_list[@]}))]}" "$i"
  done
done
echo
echo "results: $results"
summarize "$out"
