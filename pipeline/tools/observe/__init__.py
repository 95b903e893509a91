"""Watching a job from its topics: ``mixflow top`` (a live view) and ``mixflow report`` (plots and a summary),
and the per-step numbers they share with the end-of-job report of ``mixflow run``."""
