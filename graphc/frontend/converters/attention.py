"""Converters of attention ops.

Attention-23 and -24 are subsets of the IR form (Attention-25): 24 added the nonpad_kv_seqlen
input, 25 the left/right_window_size attributes, whose defaults (-1) mean no window. The 23/24
errata (zero rows for fully-masked queries, bottom-right causal alignment with a cache) apply to
those versions in place, so every version from 23 on is the IR op as it stands.
RotaryEmbedding (23) and LinearAttention (27) have one version each.
"""

from __future__ import annotations

from graphc.frontend.registry import passthrough

passthrough("Attention", since=23)
passthrough("RotaryEmbedding", since=23)
passthrough("LinearAttention", since=27)
