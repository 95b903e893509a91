"""Step composition's parts; ``pipeline.planning.mixing.compose`` is its entry."""
