"""pipeline.tools."""
