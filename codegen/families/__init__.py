"""Kernel families; importing this package registers each with graphc.codegen.kernel.

Order matters where several could match: the first match wins (hence one import per line, in
order, not sorted).
"""

# isort: off
from graphc.codegen.families import elementwise  # noqa: F401
from graphc.codegen.families import reduction  # noqa: F401
from graphc.codegen.families import data  # noqa: F401
from graphc.codegen.families import gemm  # noqa: F401
from graphc.codegen.families import gemm_int8  # noqa: F401
from graphc.codegen.families import conv  # noqa: F401
from graphc.codegen.families import pool  # noqa: F401
from graphc.codegen.families import attention  # noqa: F401
from graphc.codegen.families import topk  # noqa: F401
# isort: on
