#!/usr/bin/env bash
# The fleet proof at full size: tests/cli/test_collect_stream.sh with 3,000 jobs (three workers
# with three local databases, a kill -9 of one worker and of the collector midway; the central
# database must equal the --from-db merge of the three files, with exactly one row per job).
#
#   tests/soak/fleet_collect.sh --build BUILD_DIR [--jobs N]
#
# Exit status 0 when every check passes, 1 when one fails, 2 for a wrong command line.
set -u
build= jobs=3000
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    *) echo "usage: $0 --build BUILD_DIR [--jobs N]" >&2; exit 2 ;;
  esac
done
[ -x "$build/llmq" ] || { echo "$0: no llmq in '$build' (--build BUILD_DIR)" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
start=$(date +%s)
LLMQ_BIN=$(cd "$build" && pwd)/llmq FLEET_JOBS=$jobs WAIT_S=${WAIT_S:-900} bash "$here/../cli/test_collect_stream.sh"
rc=$?
echo "fleet_collect: $jobs jobs, $(($(date +%s) - start)) s, exit status $rc"
exit $rc
