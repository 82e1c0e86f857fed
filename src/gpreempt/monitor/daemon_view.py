"""The daemon's status for monitoring views, with the reason when there is none."""

from __future__ import annotations

from typing import Any

from ..errors import DaemonUnavailable, GpreemptError


def fetch_status(
    runtime_dir: Any = None, timeout: float = 2.0
) -> tuple[dict[str, Any] | None, str | None]:
    """(status, None) from the daemon, or (None, why not). Never raises for a missing daemon."""
    from ..client.connection import DaemonClient

    try:
        client = DaemonClient.connect(runtime_dir, timeout=timeout)
    except DaemonUnavailable as exc:
        return None, str(exc)
    try:
        return dict(client.status()), None
    except (GpreemptError, OSError) as exc:
        return None, f"the daemon did not answer a status request: {exc}"
    finally:
        client.close()


def tasks_by_pid(status: dict[str, Any] | None) -> dict[int, dict[str, Any]]:
    """Registered tasks keyed by pid."""
    if not status:
        return {}
    return {int(t["pid"]): t for t in status.get("tasks", []) if t.get("pid") is not None}
