"""sim: a tick-based engine for LLM-driven world simulations."""

__version__ = "0.1.0"
