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
from graphc.codegen.families import gemm_fp8  # noqa: F401
from graphc.codegen.families import conv  # noqa: F401
from graphc.codegen.families import pool  # noqa: F401
from graphc.codegen.families import attention  # noqa: F401
from graphc.codegen.families import topk  # noqa: F401
from graphc.codegen.families import grid_sample  # noqa: F401
from graphc.codegen.families import deform_conv  # noqa: F401
from graphc.codegen.families import roi_align  # noqa: F401

# last: apache-tvm's kernels for ops no template serves, and for forms a template refuses (graphc[tvm])
from graphc.codegen.families import tvm_kernels  # noqa: E402
# isort: on

tvm_kernels.install_fallbacks()
