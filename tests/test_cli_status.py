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


def test_status_shows_a_multi_gpu_job_under_each_of_its_gpus_as_one_task(
    capsys, monkeypatch
) -> None:
    from gpreempt.cli.status import print_status

    monkeypatch.setenv("COLUMNS", "200")
    job = {
        "pid": 7,
        "name": "ddp",
        "priority": -100,
        "priority_name": "low",
        "gpus": [0, 1],
        "processes": 3,  # torchrun and its two ranks
        "mechanism": "auto",
        "state": "suspended",
        "active": True,
        "preemptions": 1,
        "suspended_seconds": 0.4,
        "last_suspend_ms": 0.01,
        "last_mechanism": "gate",
    }
    server = {**job, "pid": 9, "name": "srv", "priority": 100, "priority_name": "high",
              "gpus": [1], "processes": 1, "state": "running"}  # fmt: skip
    daemon = {"pid": 1, "policy": "hpf", "runtime_dir": "/tmp/x", "lock_available": True}
    print_status({"daemon": daemon, "tasks": [job, server]})
    out = capsys.readouterr().out
    assert out.count("ddp (GPUs 0,1; 3 processes)") == 2  # under GPU 0 and under GPU 1
    assert "GPU 0" in out and "GPU 1" in out
    assert "srv (" not in out  # one process on one GPU: nothing to add
