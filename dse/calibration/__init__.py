"""Fitting the model: per-op kernel fits on measured kernel tables (``kernels``), the
end-to-end remainder on ../shared/calibration (``fit``) and the model's error there
(``calibrate``). Only these modules read ../shared/calibration."""
