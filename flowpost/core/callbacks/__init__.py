"""core/callbacks."""
