"""ONNX converters, one module per op family; importing this package registers them all."""

from graphc.frontend.converters import (  # noqa: F401
    constants,
    data_movement,
    elementwise,
    linalg,
    nn,
    normalization,
    reduction,
    sequence,
    shape_ops,
)
