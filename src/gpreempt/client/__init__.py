"""What runs inside the user's processes: the in-process client, the launch gate, the launcher.

- :mod:`.api`: the public calls (``gpreempt.request()``, ``attach()``, ``status()``, ...),
  re-exported by :mod:`gpreempt`; :mod:`.session` holds the one connection and control block
  of a process, and :mod:`.connection` speaks the protocol (:mod:`gpreempt.messages`).
- :mod:`.gate`: the launch gate (its config, the C++ extension in ``gate/csrc/``, the
  Python fallback, what it patches in torch); :mod:`.agent` installs it in a process started
  by ``gpreempt run`` (through ``_agent_site/sitecustomize.py``), or, in a process that
  imports CuPy and not PyTorch, :mod:`.stream_barriers` (driver calls in
  :mod:`.cuda_stream_ops`).
- :mod:`.markers`: the requests of a server that a framework runs (ASGI servers and apps,
  gRPC servers) marked as ``request()`` marks them, with no code; :mod:`.agent` arms them.
- :mod:`.launcher`: ``gpreempt run`` itself, which starts the command and keeps it safe
  whatever happens to the daemon.
- :mod:`.scheduler`: ``GPUScheduler``, the policies between threads of one process.
"""
