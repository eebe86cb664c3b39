"""The shared torch training core. Imports no orchestration libraries (prefect, dvc)."""
