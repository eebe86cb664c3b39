"""core/config."""
