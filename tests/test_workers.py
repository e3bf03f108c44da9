"""Workers: registration and heartbeats, waiting while heartbeating, the shared loop, warm shutdown on signals."""

import hashlib
import os
import signal

import psutil
import pytest
from conftest import in_thread, joined, wait_for

from tinyverse.workers import Worker, digest


def registered(db, worker) -> dict | None:
    return next((w for w in db.workers() if w["id"] == worker.id), None)


def test_a_worker_registers_on_entering_and_leaves_on_exit_even_after_an_error(db):
    worker = Worker(db, "player")
    assert registered(db, worker) is None, "registered only as a context"
    with pytest.raises(RuntimeError), worker:
        info = registered(db, worker)
        assert info["role"] == "player" and info["pid"] == os.getpid() and info["host"]
        assert info["cmdline"] == digest(psutil.Process()) and "time" in info
        raise RuntimeError("a loop failed")
    assert registered(db, worker) is None


def test_the_command_line_is_stored_as_a_digest(db):
    me = psutil.Process()
    assert digest(me) == hashlib.sha256("\0".join(me.cmdline()).encode()).hexdigest()[:16]
    with Worker(db, "trainer") as worker:
        assert " " not in registered(db, worker)["cmdline"], "a --password on the command line stays out of the db"


def test_heartbeats_carry_counters_at_most_every_two_seconds(db):
    with Worker(db, "trainer") as worker:
        first = registered(db, worker)["time"]
        assert worker.beat(updates=3) is False
        assert "updates" not in registered(db, worker), "a beat within 2 s only records the counters"
        assert worker.beat(force=True) is False
        again = registered(db, worker)
        assert again["updates"] == 3 and again["time"] >= first


def test_run_steps_the_given_times_or_until_a_step_says_stop(db):
    with Worker(db, "player") as worker:
        done = []
        worker.run(3, lambda: done.append(1) and False)
        assert len(done) == 3
        worker.run(None, lambda: done.append(1) or len(done) == 5)  # for ever, until it returns True
        assert len(done) == 5


def test_a_waiting_worker_says_why_and_a_stop_request_ends_the_wait(db):
    worker = Worker(db, "trainer")
    steps = []
    with worker:
        thread, outcome = in_thread(lambda: worker.run(None, lambda: steps.append(1), lambda: "for players"))
        waiting = wait_for(lambda: (registered(db, worker) or {}).get("waiting"), 30, "the reason in the heartbeat")
        assert waiting == "for players"
        db.request_stop(worker.id)
        joined(thread, outcome)
    assert steps == [] and worker.stop, "no step without what it waited for"


def test_waits_are_asked_in_order_and_a_grant_clears_the_reason(db):
    asked, answers = [], iter(["for a batch", None])
    with Worker(db, "trainer") as worker:
        first = lambda: asked.append("first") or next(answers)  # noqa: E731
        worker.run(1, lambda: False, first, lambda: asked.append("second"))
        assert asked == ["first", "first", "second"] and worker.info["waiting"] is None


def test_sigterm_finishes_the_step_then_stops_and_a_second_signal_interrupts(db):
    def step():
        os.kill(os.getpid(), signal.SIGTERM)  # handled in this (main) thread before kill returns
        steps.append(1)
        return False

    steps, before = [], signal.getsignal(signal.SIGTERM)
    with Worker(db, "player") as worker:
        worker.run(None, step, lambda: None)
        assert steps == [1] and worker.stop, "the step finished, no other began"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is before, "the handlers are restored"
