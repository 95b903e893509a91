"""mixflow.pipeline."""
