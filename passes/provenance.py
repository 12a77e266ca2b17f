"""Provenance moved into the IR (graphc/ir/provenance.py); these names stay importable here."""

from graphc.ir.provenance import ORIGINS_KEY, merged_origins, origins_of, origins_table

__all__ = ["ORIGINS_KEY", "merged_origins", "origins_of", "origins_table"]
