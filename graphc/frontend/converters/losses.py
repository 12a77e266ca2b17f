"""Converters of losses ops (being written)."""
