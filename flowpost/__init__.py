"""flowpost: post-training for flow-matching generators, declared as a pipeline and run as a DAG."""

from flowpost.errors import FlowpostError

__all__ = ["FlowpostError"]
__version__ = "0.1.0"
