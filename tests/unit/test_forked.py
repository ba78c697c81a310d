"""forked.at_once: pieces shared between this process and forked children, answers in the items' order."""

from __future__ import annotations

import os
import time

import pytest

from trainmem import forked

FORKS = bool(os.cpu_count() and os.cpu_count() > 1 and forked.sys.platform.startswith("linux")
             and not forked._autograd_threads())


def test_answers_come_back_in_order_from_this_process_and_its_children():
    def piece(x: int) -> tuple[int, int]:
        time.sleep(0.05 * (x % 3))
        return x * x, os.getpid()

    got = forked.at_once(piece, list(range(9)))
    assert [square for square, _ in got] == [x * x for x in range(9)]
    pids = {pid for _, pid in got}
    if FORKS:
        assert len(pids) >= 2
    if FORKS and not forked._device_threads_would_start():
        assert os.getpid() in pids  # this process takes pieces too, and keeps what they warmed


def test_a_nested_call_runs_its_pieces_in_turn():
    def inner(x: int) -> int:
        return os.getpid()

    def outer(x: int) -> list[int]:
        return forked.at_once(inner, [x, x + 1, x + 2])

    for pids in forked.at_once(outer, [0, 10]):
        assert len(set(pids)) == 1  # inside a piece: no further fork


@pytest.mark.parametrize("where", [0, 3])
def test_a_piece_that_raises_raises_here(where: int):
    def piece(x: int) -> int:
        if x == where:
            raise ValueError(f"piece {x}")
        time.sleep(0.05)
        return x

    with pytest.raises(ValueError, match=f"piece {where}"):
        forked.at_once(piece, list(range(4)))
    assert forked.at_once(lambda x: x + 1, [1, 2]) == [2, 3]  # and the next call is not held up


@pytest.mark.skipif(not FORKS, reason="needs fork and two cores")
def test_a_child_that_dies_is_an_error_not_a_hang(tmp_path):
    parent, took = os.getpid(), tmp_path / "took"

    def piece(x: int) -> int:
        if os.getpid() != parent:
            took.touch()
            os._exit(3)
        for _ in range(100):  # until the child has taken the other piece
            if took.exists():
                break
            time.sleep(0.05)
        return x

    with pytest.raises(forked.PieceFailed):
        forked.at_once(piece, [0, 1])
