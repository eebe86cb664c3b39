"""Prefect flows wrapping the node tasks."""
