"""Calibration: fit the efficiency physics on measurements.

- `fit`: the machinery (least squares within physical bounds, identifiability, leave-one-group-out CV).
- `kernels`: microbenchmark kernels and their predicted time under a profile.
- `device`: JAX microbenchmarks on the local accelerator (`roofline calibrate --device`).
- `runs`: published training runs (`roofline calibrate --from-runs`).
- `write`: profiles to TOML.
"""
