"""Monitoring and analysis: what runs on the GPUs, and what a workload does with its queues.

Read-only: nothing here registers, suspends or resumes a task. Open the module of the view you
want (the commands that print them are in :mod:`gpreempt.cli`):

- ``gpreempt top`` and ``gpreempt queues``: :mod:`.daemon_view` (the daemon's status, or why
  there is none) and :mod:`.kfd_debugfs` (AMD KFD queues from debugfs); NVIDIA GPUs and their
  processes come from :mod:`gpreempt.nvml`.
- ``gpreempt analyze amd-log``: :mod:`.amd_log` first (reading a log; the line formats), then
  :mod:`.amd_log_scanner` (the hot loop), :mod:`.amd_log_summary` (what is counted) and
  :mod:`.amd_log_compare` (Case-A vs Case-B); :mod:`.synthetic_log` writes logs for tests.
- ``gpreempt analyze trace``: :mod:`.trace` (per-stream statistics of a Chrome trace) and
  :mod:`.trace_wrapper` (runs a script under ``torch.profiler``).
- :mod:`.textfmt`: numbers and text for the tables.

Nothing here imports torch or NVML at import time; each is imported where it is used.
"""
