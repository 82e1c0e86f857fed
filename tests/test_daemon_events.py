"""The daemon's event log: rotation, following, batches."""

from __future__ import annotations

import threading
import time


def test_event_log_rotates_and_keeps_one_previous_generation(tmp_path) -> None:
    from gpreempt.daemon.event_log import EventLog, read_all_events, rotated_path

    path = tmp_path / "events.jsonl"
    log = EventLog(path, max_bytes=1000)
    for n in range(60):
        log.write("active", task="a", n=n)
    with log.batch():  # a batch is written whole, then rotated
        for n in range(60, 70):
            log.write("idle", task="a", n=n)
    log.close()
    old = rotated_path(path)
    assert old.exists() and old.stat().st_size > 1000 >= path.stat().st_size
    assert path.stat().st_mode & 0o777 == 0o600 and old.stat().st_mode & 0o777 == 0o600
    seen = [e["n"] for e in read_all_events(path)]
    assert seen == list(range(seen[0], 70)) and seen[0] > 0  # in order, the oldest dropped


def test_following_the_event_log_goes_on_across_a_rotation(tmp_path) -> None:
    from gpreempt.daemon.event_log import EventLog, follow_events

    path = tmp_path / "events.jsonl"
    log = EventLog(path, max_bytes=600)
    log.write("daemon-start")
    seen: list[int] = []

    def follow() -> None:
        for record in follow_events(path, poll_s=0.005):
            seen.append(record["n"])
            if record["n"] == 19:
                return

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    time.sleep(0.3)  # it starts at the end of the file
    for n in range(20):
        log.write("active", task="a", n=n)
        time.sleep(0.03)
    follower.join(10)
    log.close()
    assert seen == list(range(20))


def test_event_log_batch_writes_at_the_end_in_order(tmp_path) -> None:
    from gpreempt.daemon.event_log import EventLog, parse_event

    log = EventLog(tmp_path / "events.jsonl")
    log.write("registered", task="a")
    with log.batch():
        log.write("active", task="b")
        with log.batch():  # nested: still held by the outer batch
            log.write("suspend", task="a")
        assert len((tmp_path / "events.jsonl").read_text().splitlines()) == 1
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    assert [parse_event(line)["event"] for line in lines] == ["registered", "active", "suspend"]
    log.write("resume", task="a")  # after the batch: written at once again
    assert len((tmp_path / "events.jsonl").read_text().splitlines()) == 4
    log.close()
