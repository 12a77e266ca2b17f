"""ONNX converters, one module per op family; importing this package registers them all."""

from graphc.frontend.converters import (  # noqa: F401
    attention,
    constants,
    contrib,
    control_flow,
    data_movement,
    elementwise,
    linalg,
    losses,
    ml,
    nn,
    normalization,
    quantize,
    recurrent,
    reduction,
    sampling,
    sequence,
    shape_ops,
    text,
)
