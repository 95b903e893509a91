#!/usr/bin/env bash
# The multimodal job end to end on CPU, from a fresh machine: set-up, the example's images, clips and
# documents rendered offline (examples/build_multimodal_data.py), a local Kafka broker (unless
# $KAFKA_BOOTSTRAP_SERVERS is set), the job's loaders and constructor, a small vision-language model
# (examples/vlm.py: a tiny ViT feeding the example GPT) trained with DDP over 2 processes on the batches
# while they are produced, and the report (encoder and LLM balance, every sample exactly once, the loss).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bash scripts/setup.sh

.venv/bin/python examples/build_multimodal_data.py --out examples/data
if [ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ]; then
  KAFKA_BOOTSTRAP_SERVERS="$(.venv/bin/mixflow stack up | tail -n 1)"
  export KAFKA_BOOTSTRAP_SERVERS
  echo "example: Kafka at $KAFKA_BOOTSTRAP_SERVERS (stop it with: .venv/bin/mixflow stack down)"
fi
.venv/bin/mixflow spec check --files examples/multimodal.yaml
job="multimodal-$(date +%Y%m%d-%H%M%S)"
.venv/bin/mixflow run --spec examples/multimodal.yaml --job "$job" \
  --trainer "{python} -m torch.distributed.run --standalone --nproc_per_node 2 examples/train.py \
    --spec {spec} --out {out} --vision --vocab-size 8196 --checkpoint-every 50 --resume --threads 1"
.venv/bin/mixflow report --spec examples/multimodal.yaml --job "$job" --out "${MIXFLOW_STATE_DIR:-.mixflow}/jobs/$job/report"
