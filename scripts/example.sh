#!/usr/bin/env bash
# The main job end to end on the built-in example, from a fresh machine: set-up, example data from the
# standard library, a local Kafka broker (unless $KAFKA_BOOTSTRAP_SERVERS is set), then every role of
# the job (source loaders and the data constructor), training of the example GPT on the batches with DDP
# over 2 processes while they are produced, a report on what the ranks received, and plots of the job
# (`mixflow report`) in its run folder's report/.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bash scripts/setup.sh

.venv/bin/python examples/build_example_data.py --out examples/data
if [ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ]; then
  KAFKA_BOOTSTRAP_SERVERS="$(.venv/bin/mixflow stack up | tail -n 1)"
  export KAFKA_BOOTSTRAP_SERVERS
  echo "example: Kafka at $KAFKA_BOOTSTRAP_SERVERS (stop it with: .venv/bin/mixflow stack down)"
fi
.venv/bin/mixflow spec check --files examples/example.yaml
# A fresh job name per run, so each run starts from empty topics; rerunning one job resumes it.
# The trainer trains the first 250 steps (of about 1,300) so that the example ends in a few minutes on
# 2 cores; the pipeline delivers every step, and the report checks both.
job="example-$(date +%Y%m%d-%H%M%S)"
.venv/bin/mixflow run --spec examples/example.yaml --job "$job" \
  --trainer "{python} -m torch.distributed.run --standalone --nproc_per_node 2 examples/train.py \
    --spec {spec} --out {out} --steps ${MIXFLOW_EXAMPLE_STEPS:-250} --checkpoint-every 50 --resume --threads 1"
# Shares against the schedule, imbalance against naive per-rank loading, fill, throughput and backlog.
.venv/bin/mixflow report --spec examples/example.yaml --job "$job" --out "${MIXFLOW_STATE_DIR:-.mixflow}/jobs/$job/report"
