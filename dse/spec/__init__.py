"""What a user writes: the registry of settable fields (``fields``), the one validation layer
derived from it (``validate``), design files (``design``), the JSON Schemas editors use
(``schema``) and the one rule for the CSV cells dse writes (``csvsafe``). Imports ground
modules, ``dse.perf`` and ``dse.catalog`` only."""
