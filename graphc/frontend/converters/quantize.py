"""Converters of QuantizeLinear and DequantizeLinear.

Every version from 10 reads as the newest: 13 added `axis` (per-axis scales), 19 `saturate` and
float8, 21 `block_size`, `output_dtype` and the 4- and 16-bit types, 23 `precision` (Quantize) and
`output_dtype` (Dequantize); later versions only added types. An older node leaves those attributes
out, and their defaults (axis 1, saturate 1, block_size 0, no output_dtype or precision) give the
older meaning: a scalar scale is per-tensor whatever the axis.
"""

from __future__ import annotations

from graphc.frontend.registry import passthrough

passthrough("QuantizeLinear", "DequantizeLinear", since=10)
