"""core/models."""
