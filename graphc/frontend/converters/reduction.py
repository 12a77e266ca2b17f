"""Converters of reduction ops (being written)."""
