"""pipeline.roles."""
