"""mixflow.trainer_sink."""
