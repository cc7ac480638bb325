"""Kernel-level calibration: public per-op measurements, the fits on them, and their error report.

Only the fitting uses this package (``python -m dse.calibration.kernels``); the scorer reads the fitted
parameters from the catalog (``dse/catalog/kernels/*.toml``) and never needs the data.

Data: the measured per-op tables of the PyPI package ``aiconfigurator-core`` (Apache-2.0; the
optional extra ``pip install -e ".[kernels]"``), GEMM/MoE/attention/MLA/all-reduce/all-to-all
timings per GPU and runtime, and the DeepGEMM, DeepEP and NCCL rows of
``../shared/calibration/kernel_comm_measurements.csv``. Its ``silicon_sample.csv`` is end-to-end
serving data and is never read here.
"""
