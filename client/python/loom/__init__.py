"""Loom's Python client: submit jobs to a planner, follow them, read their logs and metrics, cancel
them. See loom.Client."""
from loom.client import Client, LogLine, LoomError, FINAL_STATES, state_name

__all__ = ["Client", "LogLine", "LoomError", "FINAL_STATES", "state_name"]
__version__ = "0.1.0"
