"""Package and serve TensorRT-LLM models as a Truss (see docs/design.md)."""

__version__ = "0.1.0"
