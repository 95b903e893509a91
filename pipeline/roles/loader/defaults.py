"""The loader's settings that `mixflow load --help` shows as defaults, in a module that imports nothing:
the help loads no reader, tokenizer or Kafka client."""

# Seconds of reading and tokenizing per work unit: long enough that the per-transaction overhead
# (a few ms) is small, short enough that a killed loader redoes little and units balance over loaders.
TARGET_UNIT_SECONDS = 0.5

# A dead loader's units move to the others after this long: its session in the source's group.
SESSION_TIMEOUT_MS = 10_000
