"""`gpreempt status`'s table."""

from __future__ import annotations


def test_status_table_shows_evicted_memory(capsys, monkeypatch) -> None:
    from gpreempt.cli.status import print_status

    monkeypatch.setenv("COLUMNS", "200")
    task = {
        "pid": 5,
        "name": "trainer",
        "priority": -100,
        "priority_name": "low",
        "gpus": [0],
        "mechanism": "auto",
        "state": "evicted",
        "active": False,
        "preemptions": 3,
        "suspended_seconds": 1.5,
        "last_suspend_ms": 0.02,
        "last_mechanism": "lock",
        "evicted_bytes": 32 * 2**30,
    }
    daemon = {"pid": 1, "policy": "hpf", "runtime_dir": "/tmp/x", "lock_available": True}
    print_status({"daemon": daemon, "tasks": [task]})
    out = capsys.readouterr().out
    assert "on host GiB" in out and "32.00" in out and "evicted" in out
