"""core/evaluation."""
