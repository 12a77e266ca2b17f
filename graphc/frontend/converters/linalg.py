"""Converters of linalg ops (being written)."""
