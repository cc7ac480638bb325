"""Scoring documents with the one model: case tables (``predict``), one design with its per-op
breakdown (``evaluate``) and designs under samples of the fitted parameters (``bands``)."""
