"""pipeline.kafka."""
