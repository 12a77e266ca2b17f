"""Converters of text-featurization ops on integer token ids: TfIdfVectorizer (opset 9, unchanged
since)."""

from __future__ import annotations

from graphc.frontend.registry import passthrough

passthrough("TfIdfVectorizer", since=9)
