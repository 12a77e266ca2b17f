"""Kernels of the CPU target, for the compiler's in-memory engines: the runtime's own factory.

A compiled CPU engine runs exactly what a loaded one runs: the numpy reference kernels with attrs
decoded from the step's JSON through the runtime's closed attrs table (graphc.runtime.cpu).
"""

from graphc.runtime.cpu import reference_kernel as cpu_kernel

__all__ = ["cpu_kernel"]
