"""graphc's graph optimizer: the pass manager and one module per pass."""

from graphc.passes.manager import OptimizeOptions, OptimizeResult, Pass, PassRecord, optimize

__all__ = ["OptimizeOptions", "OptimizeResult", "Pass", "PassRecord", "optimize"]
