#!/usr/bin/env bash
# The long-context job end to end on CPU, from a fresh machine: set-up, the example's sources from 64 modules of
# the standard library, a local Kafka broker (unless $KAFKA_BOOTSTRAP_SERVERS is set), the job's loaders and
# constructor (examples/long_context.yaml: 4 ranks of 1,024 tokens, aligned context parallelism up to 4 ranks, so
# that each step's long samples are split over blocks of 2 or 4 ranks), the example GPT trained on each rank's
# slices over 4 processes (examples/train_long_context.py: keys and values all-gathered within each block), its
# loss, every sample reassembled from its block's slices and compared with the source topics, and the report.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bash scripts/setup.sh

.venv/bin/python examples/build_example_data.py --out examples/data/long-context --limit 64
if [ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ]; then
  KAFKA_BOOTSTRAP_SERVERS="$(.venv/bin/mixflow stack up | tail -n 1)"
  export KAFKA_BOOTSTRAP_SERVERS
  echo "example: Kafka at $KAFKA_BOOTSTRAP_SERVERS (stop it with: .venv/bin/mixflow stack down)"
fi
.venv/bin/mixflow spec check --files examples/long_context.yaml
job="long-context-$(date +%Y%m%d-%H%M%S)"
.venv/bin/mixflow run --spec examples/long_context.yaml --job "$job" \
  --trainer "{python} -m torch.distributed.run --standalone --nproc_per_node 4 examples/train_long_context.py \
    --spec {spec} --out {out} --threads 1"
