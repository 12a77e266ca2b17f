"""graphc.codegen (being written)."""
