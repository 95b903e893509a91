"""A local single-node Apache Kafka broker (KRaft), resolved from Maven Central and run with java."""
