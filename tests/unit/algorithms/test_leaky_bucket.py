from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.algorithms import ALGORITHMS, Limit, Outcome, leaky_bucket
from sluice.algorithms.leaky_bucket import QueueState, expires_at, step
from tests.support.algorithm_properties import (
    check_fresh_burst,
    check_saturated_rate,
    check_sequence,
    limits,
    saturated_admissions,
    schedule_limits,
    schedule_times,
    sequences,
    start_times,
)
from tests.support.examples import examples

ONE_PER_SECOND_QUEUE_3 = Limit(1, 1, ALGORITHMS["leaky_bucket"], burst=3)


def test_queued_hits_wait_their_turn() -> None:
    state = None
    for delay in (0.0, 1.0, 2.0):
        state, outcome = step(state, ONE_PER_SECOND_QUEUE_3, 0.0, 1)
        assert outcome == Outcome(True, 2 - int(delay), delay + 1, delay_s=delay)
    assert state == QueueState(0.0, 3)
    assert expires_at(state, ONE_PER_SECOND_QUEUE_3) == 3.0
    refused, outcome = step(state, ONE_PER_SECOND_QUEUE_3, 0.0, 1)
    assert refused is state
    assert outcome == Outcome(False, 0, 1.0)
    assert not step(state, ONE_PER_SECOND_QUEUE_3, 0.999, 1)[1].allowed
    state, outcome = step(state, ONE_PER_SECOND_QUEUE_3, 1.0, 1)
    assert (state, outcome) == (QueueState(0.0, 4), Outcome(True, 0, 3.0, delay_s=2.0))
    assert expires_at(state, ONE_PER_SECOND_QUEUE_3) == 4.0


def test_a_drained_queue_admits_without_delay() -> None:
    state, _ = step(None, ONE_PER_SECOND_QUEUE_3, 0.0, 3)
    state, outcome = step(state, ONE_PER_SECOND_QUEUE_3, 10.0, 2)
    # Drained: the queue starts afresh at t = 10.
    assert (state, outcome) == (QueueState(10.0, 2), Outcome(True, 1, 2.0))
    assert expires_at(state, ONE_PER_SECOND_QUEUE_3) == 12.0


def test_costs_above_one_take_several_slots() -> None:
    limit = Limit(2, 1, ALGORITHMS["leaky_bucket"], burst=4)  # T = 0.5
    state, _ = step(None, limit, 0.0, 1)
    state, outcome = step(state, limit, 0.0, 2)
    assert (state, outcome) == (QueueState(0.0, 3), Outcome(True, 1, 1.5, delay_s=0.5))
    assert expires_at(state, limit) == 1.5
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


@settings(max_examples=examples(300), deadline=None)
@given(limit=limits("leaky_bucket"), t0=start_times, steps=sequences())
def test_properties(limit: Limit, t0: float, steps: list[tuple[float, int]]) -> None:
    check_sequence(leaky_bucket, limit, t0, steps)


def test_a_fresh_key_admits_the_whole_burst_at_once_for_every_rate() -> None:
    # 50 per minute, burst 50 used to admit 49: T = 1.2 s summed fifty times falls a few
    # ulps past tau = 1.2 * 50.
    for t in (0.0, 1000.0, 1_764_000_000.123):
        for rate in range(1, 201):
            check_fresh_burst(leaky_bucket, Limit(rate, 60, ALGORITHMS["leaky_bucket"], rate), t, 1)


@settings(max_examples=examples(300), deadline=None)
@given(shape=schedule_limits, t=schedule_times, data=st.data())
def test_a_fresh_key_admits_exactly_the_burst(shape: tuple[int, int, int], t: float, data) -> None:
    rate, period, burst = shape
    cost = data.draw(st.one_of(st.just(1), st.integers(1, burst)), label="cost")
    check_fresh_burst(leaky_bucket, Limit(rate, period, ALGORITHMS["leaky_bucket"], burst), t, cost)


def test_a_long_saturated_run_keeps_the_rate_without_drift() -> None:
    # 1000 per second from an epoch-scale time: each T = 0.001 added to a stored time used to
    # round by up to half an ulp (1.2e-7 s), the same way every time, so the admitted count
    # drifted by about one per ten thousand. Here hits come at twice the rate for 100 s.
    limit = Limit(1000, 1, ALGORITHMS["leaky_bucket"], 5)
    admitted, elapsed = saturated_admissions(
        leaky_bucket, limit, 1_764_000_000.123, 0.0005, 200_001
    )
    check_saturated_rate(limit, admitted, elapsed)
    # 100,000 hits at exactly the emission interval once the burst is spent: rounding may
    # refuse one (the time it arrives at rounds a hair early), which leaves a whole T of
    # slack for all the others. Drift used to refuse one in ten thousand here.
    t0 = 1_764_000_000.123
    limit = Limit(1004, 1, ALGORITHMS["leaky_bucket"], 5)
    state = None
    for _ in range(5):
        state, _ = step(state, limit, t0, 1)
    admitted = 0
    for i in range(1, 100_001):
        new, outcome = step(state, limit, t0 + i * (1 / 1004), 1)
        if outcome.allowed:
            state, admitted = new, admitted + 1
    assert admitted >= 99_999


@settings(max_examples=examples(25), deadline=None)
@given(shape=schedule_limits, t0=schedule_times, speed=st.sampled_from([1.5, 2.0, 3.0, 10.0]))
def test_saturation_admits_the_burst_then_the_rate(
    shape: tuple[int, int, int], t0: float, speed: float
) -> None:
    rate, period, burst = shape
    # A burst of 1 leaves no slack for hits that arrive between emission times (each waits
    # for the next arrival), so the rate is only reached from a burst of 2.
    limit = Limit(rate, period, ALGORITHMS["leaky_bucket"], max(burst, 2))
    gap = period / rate / speed  # hits arrive faster than the rate
    admitted, elapsed = saturated_admissions(leaky_bucket, limit, t0, gap, 10_000)
    check_saturated_rate(limit, admitted, elapsed)
