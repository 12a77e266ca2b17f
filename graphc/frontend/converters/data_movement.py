"""Converters of data_movement ops (being written)."""
