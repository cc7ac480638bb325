"""What a user writes: the registry of settable fields (``fields``), the one validation layer
derived from it (``validate``), design files (``design``) and the JSON Schemas editors use
(``schema``). Imports ground modules, ``dse.perf`` and ``dse.catalog`` only."""
