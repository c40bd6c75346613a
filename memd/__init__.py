"""memd: persistent conversation memory for LLM clients."""

__version__ = "0.1.0"
