"""graphc's graph optimizer: the pass manager, the pipeline (passes/pipeline.py), one module per
pass, the target context and the pass instruments."""

from graphc.passes.instruments import DumpIR, PassInstrument, PassTiming, VerifyIR
from graphc.passes.manager import OptimizeOptions, OptimizeResult, Pass, PassRecord, optimize
from graphc.passes.target import Target

__all__ = [
    "DumpIR",
    "OptimizeOptions",
    "OptimizeResult",
    "Pass",
    "PassInstrument",
    "PassRecord",
    "PassTiming",
    "Target",
    "VerifyIR",
    "optimize",
]
