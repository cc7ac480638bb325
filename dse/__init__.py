"""dse: design-space optimizer for LLM serving hardware and models."""

__version__ = "0.1.0"
