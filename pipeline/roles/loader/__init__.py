"""pipeline.roles.loader."""
