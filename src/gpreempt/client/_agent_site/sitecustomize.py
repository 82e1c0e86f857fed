"""Loaded by Python processes started under ``gpreempt run`` (placed on PYTHONPATH).

Starts the in-process client, then hands over to any other sitecustomize that this one
shadows, so the user's own site customisation still runs.
"""

import os
import sys


def _boot() -> None:
    try:
        from gpreempt.client import agent
    except Exception as exc:  # never break the user's program over gpreempt
        if os.environ.get("GPREEMPT_DEBUG"):
            print(f"gpreempt: in-process client unavailable: {exc!r}", file=sys.stderr)
        return
    agent.boot()


def _chain() -> None:
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location(
                "_gpreempt_chained_sitecustomize", candidate
            )
            if spec and spec.loader:
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            return


_boot()
_chain()
