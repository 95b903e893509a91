"""The wire formats of a job's topics, as ``topics/FORMAT.md`` writes them down: topic names and layout
(partitions, lanes), samples (Avro), batches (Arrow IPC) and their media, dead letters, progress records,
and the JSON record codec the small records share. It imports no Kafka client: a message is read through
the few methods a ``confluent_kafka.Message`` has (``value()``, ``headers()``, ``topic()``, ...)."""
