"""mixflow.topics."""
