"""The ONNX frontend: ONNX models to IR graphs."""

from graphc.frontend.convert import find_unsupported, load_onnx
from graphc.frontend.loader import read_model

__all__ = ["find_unsupported", "load_onnx", "read_model"]
