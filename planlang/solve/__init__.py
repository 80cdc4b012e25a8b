"""Solvers: plain-data kernels (ILP, pipeline DPs, rotor) and adapters from plans and models."""
