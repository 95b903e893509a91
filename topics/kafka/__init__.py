"""The Kafka client plumbing of every side, the trainer's sink included: client settings and clients,
topic and ACL administration, probes of a cluster, authorization refusals said in one line, the retry
policy of Kafka calls, offset lookups, consumers that renew a stalled client, reading a topic to its end,
and finding a step in a rank topic. What is on the topics is ``topics.formats``."""
