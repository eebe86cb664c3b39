"""core/trainers."""
