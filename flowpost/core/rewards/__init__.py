"""Reward scorers: decoded media + prompts + metadata -> one float per sample."""
