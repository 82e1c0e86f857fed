"""KFD debugfs parsing (mqds, hqds) on fixtures in the kernel's exact print format."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpreempt.monitor import kfd_debugfs as kfd

FIX = Path(__file__).parent / "fixtures" / "amd"


def test_mqds_processes_and_queue_types():
    view = kfd.parse_mqds((FIX / "mqds.txt").read_text())
    assert view.unparsed_lines == 0
    assert [(p.pid, p.pasid) for p in view.processes] == [
        (157801, "0x8001"),
        (157933, "0x8002"),
        (160001, "0x8003"),
    ]
    assert [(q.type, q.device) for q in view.processes[0].queues] == [
        ("compute", "6c2b"),
        ("sdma", "6c2b"),
    ]
    assert [q.type for q in view.processes[1].queues] == ["compute", "compute", "diq"]
    assert view.processes[2].queues == []


def test_mqds_decodes_ring_address_and_priority():
    view = kfd.parse_mqds((FIX / "mqds.txt").read_text())
    q = view.processes[0].queues[0]
    assert len(q.mqd_words) == 1 and len(q.mqd_words[0]) == 512
    d = q.to_dict()
    # The ring address is the HIP log's HWq of the same process (fixture level4_two_processes).
    assert d["ring_address"] == "0x7fad66c00000"
    assert (d["queue_priority"], d["mqd_active"], d["xcc"]) == (7, True, 1)
    multi = view.processes[1].queues[1]
    assert len(multi.mqd_words) == 2  # one MQD per XCC
    assert multi.to_dict()["queue_priority"] == 15
    assert "ring_address" not in view.processes[0].queues[1].to_dict()  # SDMA


def test_mqds_has_no_queue_id_lines():
    text = (FIX / "mqds.txt").read_text()
    assert "Queue ID" not in text


def test_mqds_decimal_pasid_and_unknown_lines():
    view = kfd.parse_mqds(
        "Process 12 PASID 32770:\n  Compute queue on device 1a2b\n"
        "  Bad user queue type 9 on device 1a2b\nsomething else\n"
    )
    assert view.processes[0].pasid == "32770"
    assert [q.type for q in view.processes[0].queues] == ["compute", "unknown(9)"]
    assert view.unparsed_lines == 1
    assert view.processes[0].queues[0].to_dict()["ring_address"] is None


def test_hqds_nodes_active_queues_and_stopped_device():
    view = kfd.parse_hqds((FIX / "hqds.txt").read_text())
    assert view.unparsed_lines == 0
    n1, n2 = view.nodes
    assert (n1.node, n1.gpu_id, n1.stopped) == (1, "6c2b", False)
    assert (n2.node, n2.gpu_id, n2.stopped) == (2, "9a1e", True)
    assert view.stopped_devices == ["9a1e"]
    d = n1.to_dict()
    assert (d["cp_slots"], d["cp_active"]) == (8, 3)
    assert d["active_per_pipe"] == {
        "inst0/pipe0": 1,
        "inst0/pipe1": 1,
        "inst0/pipe2": 1,
        "inst0/pipe3": 0,
    }
    assert (d["sdma_slots"], d["sdma_active"]) == (4, 1)
    hiq = n1.hqds[0]
    assert (hiq.kind, hiq.mec, hiq.pipe, hiq.queue, hiq.active) == ("hiq", 2, 1, 0, True)
    active = [h for h in d["hqds"] if h["kind"] == "cp"]
    assert {h["ring_address"] for h in active} == {
        "0x7fad66c00000",
        "0x7f1a11400000",
        "0x7f1a11800000",
    }
    assert {h["queue_priority"] for h in active} == {7, 15}


def test_hqds_register_addresses_follow_line_offsets():
    view = kfd.parse_hqds((FIX / "hqds.txt").read_text())
    cp = view.nodes[0].hqds[1]
    assert len(cp.registers) == 56
    assert cp.registers[0][0] == 0xC914 and cp.registers[8][0] == 0xC934
    sdma = [h for h in view.nodes[0].hqds if h.kind == "sdma"][0]
    assert len(sdma.registers) == 30  # two register ranges


def test_hqds_all_slots_listed_on_request():
    view = kfd.parse_hqds((FIX / "hqds.txt").read_text())
    assert len(view.nodes[0].to_dict(all_hqds=True)["hqds"]) == 1 + 8 + 4
    assert len(view.nodes[0].to_dict()["hqds"]) == 1 + 3 + 1


def test_read_debugfs_reasons(tmp_path, monkeypatch):
    # debugfs directory exists but is not a mount point: say so.
    root = tmp_path / "debug" / "kfd"
    (tmp_path / "debug").mkdir()
    with pytest.raises(kfd.SourceUnavailable, match="not mounted"):
        kfd.read_debugfs("mqds", root)
    # Mounted, no kfd directory, no /dev/kfd: no driver.
    monkeypatch.setattr(kfd, "_is_mounted", lambda p: True)
    real_exists = Path.exists

    def fake_exists(self):
        return False if str(self) == "/dev/kfd" else real_exists(self)

    monkeypatch.setattr(Path, "exists", fake_exists)
    with pytest.raises(kfd.SourceUnavailable, match="no AMD KFD driver"):
        kfd.read_debugfs("mqds", root)
    root.mkdir()
    (root / "mqds").write_text("Process 1 PASID 0x1:\n")
    assert kfd.read_debugfs("mqds", root).startswith("Process 1")


def test_read_debugfs_permission(tmp_path, monkeypatch):
    root = tmp_path / "kfd"
    root.mkdir()
    (root / "hqds").write_text("x")

    def denied(self, *a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_text", denied)
    monkeypatch.setattr(kfd.os, "geteuid", lambda: 1000)
    with pytest.raises(kfd.SourceUnavailable, match="root only.*sudo"):
        kfd.read_debugfs("hqds", root)
