#!/usr/bin/env bash
# The test command: set-up on a fresh machine, a real Kafka broker, lint, and the whole test suite.
# Extra arguments go to pytest. Uses $KAFKA_BOOTSTRAP_SERVERS when set; otherwise starts the local
# broker (`mixflow stack up`) and stops it again at the end if it was not running before.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bash scripts/setup.sh

if [ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ]; then
  if ! .venv/bin/mixflow stack status >/dev/null 2>&1; then
    # --force: a role the suite killed stays a group member until its session times out.
    trap '.venv/bin/mixflow stack down --force' EXIT
  fi
  KAFKA_BOOTSTRAP_SERVERS="$(.venv/bin/mixflow stack up | tail -n 1)"
  export KAFKA_BOOTSTRAP_SERVERS
fi
echo "test: Kafka at $KAFKA_BOOTSTRAP_SERVERS"

.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports
.venv/bin/mypy  # topics and trainer_sink: [tool.mypy] in pyproject.toml
# Compile the planning kernels once, into numba's cache: else every worker and role process started before
# the cache is written compiles its own (about a minute each on a small machine).
.venv/bin/python -m pipeline.planning.warm
# The Kafka tests mostly wait on the broker and on role processes, so several workers share the cores
# well; a test file stays on one worker (module fixtures build a job once). MIXFLOW_TEST_WORKERS=0: serial.
# --durations: the slowest tests, to see where the suite's time goes.
began=$SECONDS
status=0
.venv/bin/python -m pytest -p no:cacheprovider -n "${MIXFLOW_TEST_WORKERS:-3}" --dist loadfile --durations=40 "$@" \
  || status=$?
echo "test: suite took $((SECONDS - began)) s"
exit "$status"
