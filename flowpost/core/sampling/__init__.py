"""Sigma schedules and sampler steps (pure functions, no scheduler state), and the sampling config."""
