"""The package's version (the run manifests record it; a run resumes only under the same minor)."""

__version__ = "0.1.0"
