"""core/sampling."""
