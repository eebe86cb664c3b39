"""Trainers on finite datasets (the dataset contract)."""
