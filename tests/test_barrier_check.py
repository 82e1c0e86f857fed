"""The rule of the driver-level gate's check that stream barriers hold (``barrier_check.h``),
run on the CPU: a watched task's control-block words written as the gates write them, read
where the check reads them, the verdict on each barrier, and when a hold rises (where the
gate's thread puts a barrier for the check to date)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import build_gate_rule, run_gate_rule

# One watched task's control block. Reads commands, one a line:
#   requests N / active N   the task writes that word (a rise bumps the epoch, gate_words.h)
#   put KIND                a barrier whose last wait reads requests, active or the pair, put
#                           now (its word read just before)
#   pending                 a look finds the event before that barrier pending
#   relist                  the daemon publishes a new watch list (the same block)
#   done                    a look finds the mark behind the barrier complete: prints
#                           "leak" or "held"
#   dated                   the same look: prints "dated" where the check could tell (its
#                           word read raised before the GPU reached it, the same watch list),
#                           "undated" otherwise
#   gate N                  the daemon writes the trainer's own gate word
#   look                    a look of the gate's thread: prints "rose" where a hold rose since
#                           its last look (HoldRise), "-" otherwise
PROGRAM = r"""
#include <cstdio>
#include <cstring>
#include "barrier_check.h"
using namespace gpreempt_driver;
int main() {
  alignas(8) static uint8_t block[gpreempt_layout::kSize] = {};
  uint32_t gate_word = 0;
  HoldRise rise;
  WatchList lists[2];
  for (WatchList& l : lists) { l.n = 1; l.blocks[0] = block; l.version = 1; }
  const WatchList* list = &lists[0];
  BarrierNote note;
  char line[64], kind[16];
  unsigned value = 0;
  while (std::fgets(line, sizeof line, stdin)) {
    if (std::sscanf(line, "requests %u", &value) == 1) {
      gpreempt_words::set_activity_word(block, gpreempt_layout::kOffRequests, value);
    } else if (std::sscanf(line, "active %u", &value) == 1) {
      gpreempt_words::set_activity_word(block, gpreempt_layout::kOffAutoActive, value);
    } else if (std::sscanf(line, "put %15s", kind) == 1) {
      note = BarrierNote{};
      note.list = list;
      note.words = std::strcmp(kind, "requests") == 0 ? Words::kRequests
                   : std::strcmp(kind, "active") == 0 ? Words::kActive
                                                      : Words::kPair;
      note.unpassed = look_of(note, sample_words(list));
    } else if (std::strncmp(line, "pending", 7) == 0) {
      const WordLook look = look_of(note, sample_words(list));
      if (look.valid) note.unpassed = look;
    } else if (std::strncmp(line, "relist", 6) == 0) {
      list = &lists[1];
    } else if (std::strncmp(line, "done", 4) == 0) {
      std::printf("%s\n", passed_while_raised(note, sample_words(list)) ? "leak" : "held");
    } else if (std::strncmp(line, "dated", 5) == 0) {
      std::printf("%s\n", dated(note, sample_words(list)) ? "dated" : "undated");
    } else if (std::sscanf(line, "gate %u", &value) == 1) {
      gate_word = value;
    } else if (std::strncmp(line, "look", 4) == 0) {
      std::printf("%s\n", rise.rose(gate_word, list) ? "rose" : "-");
    } else {
      return 2;
    }
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def check(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The rule compiled, as the gate compiles it, into a program of its own."""
    return build_gate_rule(tmp_path_factory.mktemp("barrier_check"), PROGRAM)


def verdicts(binary: Path, *commands: str) -> list[str]:
    """What the program prints for ``commands``, run in order: a line for each ``done``,
    ``dated`` and ``look``."""
    return run_gate_rule(binary, commands)


def test_a_barrier_put_while_the_server_was_active_and_passed_so_leaked(check: Path) -> None:
    assert verdicts(check, "active 1", "put pair", "done") == ["leak"]
    assert verdicts(check, "requests 1", "put requests", "done") == ["leak"]
    assert verdicts(check, "requests 1", "put pair", "done") == ["leak"]


def test_a_barrier_reached_after_the_server_rose_and_passed_so_leaked(check: Path) -> None:
    """Put while the server was idle, the trainer's queue still ahead of it when the server
    rose: the look that finds the event before the barrier pending reads the word raised."""
    assert verdicts(check, "put pair", "active 1", "pending", "done") == ["leak"]


def test_a_barrier_reached_before_the_server_rose_did_not_leak(check: Path) -> None:
    """The GPU reached it while the server was idle and passed it then; the event behind it
    completed after the server rose (another context's time slice in between). The word,
    raised at two looks before the mark was seen complete, did not stay raised through the
    pass: the rule the check had before counted this as a leak."""
    assert verdicts(check, "put pair", "pending", "active 1", "done") == ["held"]


def test_a_server_that_dropped_and_rose_again_in_between_let_it_pass(check: Path) -> None:
    commands = ("active 1", "put pair", "active 0", "active 1", "done")
    assert verdicts(check, *commands) == ["held"]
    commands = ("requests 1", "put requests", "requests 0", "requests 2", "done")
    assert verdicts(check, *commands) == ["held"]


def test_a_word_down_when_the_mark_completed_proves_nothing(check: Path) -> None:
    assert verdicts(check, "active 1", "put pair", "active 0", "done") == ["held"]


def test_a_wait_on_requests_alone_does_not_read_auto_active(check: Path) -> None:
    """A task that marks its requests: its launches' activity holds nothing."""
    assert verdicts(check, "active 1", "put requests", "done") == ["held"]


def test_a_new_watch_list_proves_nothing_about_a_barrier_put_on_the_old(check: Path) -> None:
    assert verdicts(check, "active 1", "put pair", "relist", "done") == ["held"]


def test_each_barrier_is_judged_on_its_own(check: Path) -> None:
    commands = (
        *("put pair", "pending", "active 1", "done"),  # reached before the rise
        *("put pair", "done"),  # put while raised
        *("active 0", "put pair", "done"),  # put while idle, passed while idle
    )
    assert verdicts(check, *commands) == ["held", "leak", "held"]


def test_a_barrier_counts_as_checked_only_where_its_word_was_read_raised_before_the_pass(
    check: Path,
) -> None:
    """``barriers_checked`` counts the barriers the check could date, leaked or not: their
    word read raised before the GPU reached them, and read again in the same watch list."""
    assert verdicts(check, "active 1", "put pair", "dated") == ["dated"]
    assert verdicts(check, "put pair", "active 1", "pending", "dated") == ["dated"]
    # held, and dated: the server dropped and rose again in between
    assert verdicts(check, "requests 1", "put requests", "requests 0", "requests 2", "dated") == [
        "dated"
    ]
    assert verdicts(check, "put pair", "dated") == ["undated"]  # put and passed while idle
    assert verdicts(check, "put pair", "pending", "active 1", "dated") == ["undated"]
    assert verdicts(check, "active 1", "put pair", "relist", "dated") == ["undated"]
    assert verdicts(check, "active 1", "put requests", "dated") == ["undated"]


def test_a_hold_rises_once_at_the_first_look_that_finds_it(check: Path) -> None:
    """A watched task's activity or the gate closed outright; a word closed while watched
    (even) holds only while a watched task is active, so it raises nothing by itself."""
    assert verdicts(check, "look", "active 1", "look", "look", "active 0", "look") == [
        "-",
        "rose",
        "-",
        "-",
    ]
    assert verdicts(check, "requests 1", "look", "requests 0", "look", "active 1", "look") == [
        "rose",
        "-",
        "rose",
    ]
    assert verdicts(check, "gate 2", "look", "gate 3", "look", "active 1", "look") == [
        "-",
        "rose",
        "-",
    ]


def test_a_barrier_put_at_the_rise_dates_a_hold_whose_last_barrier_the_gpu_had_reached(
    check: Path,
) -> None:
    """A program whose CPU keeps pace: the GPU reached its one barrier in flight before the
    server rose, and before any look, so nothing dates that one; it then stands on it, putting
    none. The barrier the thread puts behind it at the rise is read raised as it is put, and
    dated once the hold ends."""
    assert verdicts(check, "put pair", "active 1", "active 0", "dated") == ["undated"]
    commands = ("put pair", "active 1", "look", "put pair", "active 0", "dated")
    assert verdicts(check, *commands) == ["rose", "dated"]
