from __future__ import annotations

from hypothesis import given, settings

from sluice.algorithms import ALGORITHMS, Limit, Outcome, leaky_bucket
from sluice.algorithms.leaky_bucket import QueueState, expires_at, step
from tests.support.algorithm_properties import check_sequence, limits, sequences, start_times

ONE_PER_SECOND_QUEUE_3 = Limit(1, 1, ALGORITHMS["leaky_bucket"], burst=3)


def test_queued_hits_wait_their_turn() -> None:
    state = None
    for delay in (0.0, 1.0, 2.0):
        state, outcome = step(state, ONE_PER_SECOND_QUEUE_3, 0.0, 1)
        assert outcome == Outcome(True, 2 - int(delay), delay + 1, delay_s=delay)
    assert state == QueueState(3.0)
    refused, outcome = step(state, ONE_PER_SECOND_QUEUE_3, 0.0, 1)
    assert refused is state
    assert outcome == Outcome(False, 0, 1.0)
    assert not step(state, ONE_PER_SECOND_QUEUE_3, 0.999, 1)[1].allowed
    state, outcome = step(state, ONE_PER_SECOND_QUEUE_3, 1.0, 1)
    assert (state, outcome) == (QueueState(4.0), Outcome(True, 0, 3.0, delay_s=2.0))


def test_a_drained_queue_admits_without_delay() -> None:
    state, _ = step(None, ONE_PER_SECOND_QUEUE_3, 0.0, 3)
    state, outcome = step(state, ONE_PER_SECOND_QUEUE_3, 10.0, 2)
    assert (state, outcome) == (QueueState(12.0), Outcome(True, 1, 2.0))


def test_costs_above_one_take_several_slots() -> None:
    limit = Limit(2, 1, ALGORITHMS["leaky_bucket"], burst=4)  # T = 0.5
    state, _ = step(None, limit, 0.0, 1)
    state, outcome = step(state, limit, 0.0, 2)
    assert (state, outcome) == (QueueState(1.5), Outcome(True, 1, 1.5, delay_s=0.5))
    assert step(state, limit, 0.0, 2)[1] == Outcome(False, 1, 0.5)


def test_cost_zero_checks_without_consuming() -> None:
    state, _ = step(None, ONE_PER_SECOND_QUEUE_3, 0.0, 2)
    assert step(state, ONE_PER_SECOND_QUEUE_3, 0.5, 0) == (state, Outcome(True, 1, 1.5))


def test_a_cost_above_the_bucket_never_fits() -> None:
    outcome = step(None, ONE_PER_SECOND_QUEUE_3, 0.0, 4)[1]
    assert outcome == Outcome(False, 3, 0.0, fits=False)


def test_limit_zero_admits_nothing() -> None:
    for cost in (0, 1):
        outcome = step(None, Limit(0, 1, ALGORITHMS["leaky_bucket"], 3), 0.0, cost)[1]
        assert outcome == Outcome(False, 0, 0.0, fits=False)


def test_expires_when_the_queue_drains() -> None:
    assert expires_at(QueueState(4.0), ONE_PER_SECOND_QUEUE_3) == 4.0


@settings(max_examples=300, deadline=None)
@given(limit=limits("leaky_bucket"), t0=start_times, steps=sequences())
def test_properties(limit: Limit, t0: float, steps: list[tuple[float, int]]) -> None:
    check_sequence(leaky_bucket, limit, t0, steps)
