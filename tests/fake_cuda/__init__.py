"""Fake CUDA runtime and NCCL for CPU-only tests of the GPU code paths; see README.md."""
