"""pipeline.tools.run."""
