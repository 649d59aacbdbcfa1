"""Triton W4A16 kernels for NVFP4 and MXFP4, their torch references and benchmarks."""
