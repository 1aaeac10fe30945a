"""Corpora and the layout-invariant packed-sequence loader."""
