"""mixflow.connectors."""
