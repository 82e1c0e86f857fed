"""Monitoring and analysis: NVML, KFD debugfs, HIP runtime logs, PyTorch traces.

Nothing here imports torch or NVML at import time; each is imported where it is used.
"""
