"""pipeline.planning.step."""
