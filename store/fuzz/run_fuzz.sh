#!/usr/bin/env bash
# run_fuzz.sh FUZZER WORK_DIR SECONDS: runs a libFuzzer binary for a bounded time from a
# fresh seed corpus (valid frames of both dialects), with memory limits, in WORK_DIR.
set -euo pipefail
fuzzer=$1 work=$2 seconds=$3
dict=$(dirname "$0")/store.dict
rm -rf "$work"
mkdir -p "$work/corpus" "$work/artifacts"
# Seeds: [limits byte][split byte][stream] for the parser target; the session target
# reads them as records, which is fine for a start.
printf '\x00\x05\x00\xce\xf7\x85\x3c\x0d\x01\x00\x00\x00' > "$work/corpus/v2_ping"
printf '\x01\x01\x00\xce\xf7\x85\x3c\x06\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00k\x0c' \
  > "$work/corpus/v2_wait_cancel"
printf '\x00\x03\x00\x01\x00\x00\x00\x00\x00\x00\x00k\x01\x00\x00\x00\x00\x00\x00\x00v\x06' \
  > "$work/corpus/v1_set_numkeys"
printf '\x00\x02\x03\x05\x00\x00\x00\x00\x00\x00\x00init/\x01\x00\x00\x00\x00\x00\x00\x00' \
  > "$work/corpus/v1_add"
printf '\x01\x03\x00\xce\xf7\x85\x3c\x0b\x02\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00a\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00b\x01\x00\x00\x00\x00\x00\x00\x00c' \
  > "$work/corpus/v2_multi_set"
cd "$work"
exec "$fuzzer" corpus -dict="$dict" -max_total_time="$seconds" -rss_limit_mb=512 \
  -malloc_limit_mb=64 -timeout=10 -max_len=4096 -print_final_stats=1 \
  -artifact_prefix="$work/artifacts/"
