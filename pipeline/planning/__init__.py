"""pipeline.planning."""
