"""Properties every algorithm module satisfies, checked along random hit sequences.

Shared by the per-algorithm unit tests (each drives its module through ``check_sequence``)
and by the Redis scripts' integration tests (the time strategies).
"""

from __future__ import annotations

from types import ModuleType

from hypothesis import strategies as st

from sluice.algorithms import ALGORITHMS, Limit

BUCKETS = ("token_bucket", "leaky_bucket", "gcra")

# Exact binary fractions, awkward decimals, window edges and arbitrary floats.
time_steps = st.one_of(
    st.sampled_from([0.0, 0.001, 0.1, 1 / 3, 0.5, 1.0, 2.5, 7.0, 59.999, 60.0, 3600.0]),
    st.floats(0.0, 200.0, allow_nan=False, allow_infinity=False),
)
start_times = st.one_of(
    st.sampled_from([0.0, 0.1, 1_700_000_000.0, 1_700_000_000.123456]),
    st.floats(0.0, 1e10, allow_nan=False, allow_infinity=False),
)


@st.composite
def limits(draw: st.DrawFn, algorithm: str) -> Limit:
    rate = draw(st.one_of(st.integers(0, 6), st.sampled_from([7, 50, 1000])))
    period = draw(st.sampled_from([1, 2, 3, 7, 60, 3600]))
    burst = draw(st.integers(0, 6)) if algorithm in BUCKETS else 0
    return Limit(rate, period, ALGORITHMS[algorithm], burst)


def capacity(limit: Limit) -> int:
    return limit.burst if limit.algorithm.name in BUCKETS else limit.requests_per_unit


def sequences(max_cost: int = 8) -> st.SearchStrategy[list[tuple[float, int]]]:
    return st.lists(st.tuples(time_steps, st.integers(0, max_cost)), min_size=1, max_size=25)


def check_sequence(
    module: ModuleType, limit: Limit, t0: float, steps: list[tuple[float, int]]
) -> None:
    cap = capacity(limit)
    state = None
    t = t0
    for dt, raw_cost in steps:
        t += dt
        cost = raw_cost % (cap + 2)  # 0..cap+1: mostly fitting, sometimes one too many
        new, outcome = module.step(state, limit, t, cost)
        fits = limit.requests_per_unit > 0 and cost <= cap
        assert outcome.fits == fits, outcome
        assert outcome.remaining >= 0
        if not outcome.allowed:
            assert new is state  # a refused hit changes nothing
        if not fits:
            assert not outcome.allowed and outcome.reset_s == 0
        elif cost == 0:
            assert outcome.allowed and new is state
        if outcome.allowed and cost > 0:
            assert outcome.reset_s == module.expires_at(new, limit) - t
        if outcome.delay_s:
            assert limit.algorithm.name == "leaky_bucket" and 0 < outcome.delay_s <= outcome.reset_s
        _check_remaining(module, limit, new if outcome.allowed else state, t, outcome.remaining)
        if fits and not outcome.allowed:
            _check_reset(module, limit, state, t, cost, outcome.reset_s)
        if new is not None:
            _check_expiry(module, limit, new, cost)
        state = new


def _check_remaining(
    module: ModuleType, limit: Limit, state: object, t: float, remaining: int
) -> None:
    if remaining > 0:
        assert module.step(state, limit, t, remaining)[1].allowed
    assert not module.step(state, limit, t, remaining + 1)[1].allowed


def _check_reset(
    module: ModuleType, limit: Limit, state: object, t: float, cost: int, reset_s: float
) -> None:
    assert reset_s > 0
    assert module.step(state, limit, t + reset_s, cost)[1].allowed, "reset_s is early"
    # Not late either, beyond float rounding (far below a microsecond here).
    before = t + reset_s - 1e-12 * max(1.0, t + reset_s)
    if before > t:
        assert not module.step(state, limit, before, cost)[1].allowed, "reset_s is late"


def _check_expiry(module: ModuleType, limit: Limit, state: object, cost: int) -> None:
    """From expires_at on, the state is exactly like a missing one (so it may be dropped)."""
    at = module.expires_at(state, limit)
    for x in (at, at + 0.5, at + 3 * limit.period_s):
        kept, outcome = module.step(state, limit, x, cost)
        fresh, fresh_outcome = module.step(None, limit, x, cost)
        assert outcome == fresh_outcome
        if outcome.allowed and cost > 0:
            assert kept == fresh


# gcra and leaky_bucket: any rate, period, burst and start time, including epoch-scale times
# (an ulp of 1.7e9 s is 2.4e-7 s) and rates whose interval ``P / L`` is no binary fraction.
schedule_limits = st.builds(
    lambda rate, period, burst: (rate, period, burst),
    st.one_of(st.integers(1, 200), st.integers(1, 100_000)),
    st.sampled_from([1, 2, 3, 7, 10, 60, 3600, 86400]),
    st.one_of(st.integers(1, 60), st.integers(1, 2000)),
)
schedule_times = st.one_of(
    st.sampled_from([0.0, 1000.0, 1_700_000_000.0, 1_764_000_000.123]),
    st.floats(0.0, 1e10, allow_nan=False, allow_infinity=False),
)


def check_fresh_burst(module: ModuleType, limit: Limit, t: float, cost: int) -> None:
    """A fresh key admits exactly ``burst // cost`` hits of ``cost`` at one instant, with
    ``remaining`` counting down exactly, and then refuses with a reset in the future."""
    state = None
    for admitted in range(1, limit.burst // cost + 1):
        state, outcome = module.step(state, limit, t, cost)
        assert outcome.allowed, f"hit {admitted} of {limit.burst // cost} refused"
        assert outcome.remaining == limit.burst - admitted * cost
    refused, outcome = module.step(state, limit, t, cost)
    assert not outcome.allowed, f"admitted {limit.burst // cost + 1} of cost {cost} at once"
    assert refused is state and outcome.reset_s > 0


def saturated_admissions(
    module: ModuleType, limit: Limit, t0: float, gap: float, hits: int
) -> tuple[int, float]:
    """Hits every ``gap`` seconds from ``t0`` (each time ``t0 + i * gap``: the test's clock
    does not drift), as an explicit ``now``; (how many were admitted, seconds elapsed)."""
    state = None
    admitted = 0
    for i in range(hits):
        new, outcome = module.step(state, limit, t0 + i * gap, 1)
        if outcome.allowed:
            state, admitted = new, admitted + 1
    return admitted, (hits - 1) * gap


def check_saturated_rate(limit: Limit, admitted: int, elapsed: float) -> None:
    """Over ``elapsed`` seconds of saturation: the burst, then one every ``T``, no drift.

    In exact arithmetic ``admitted * T <= elapsed + b * T`` (the schedule never runs more
    than ``b`` cells ahead), and the schedule runs at least ``(b - 1) * T - gap`` ahead of the
    last hit, so ``admitted - b`` lies in ``(elapsed / T - 2, elapsed / T]``; one more on top
    allows for rounding.
    """
    expected = elapsed * limit.requests_per_unit / limit.period_s
    assert expected - 2 <= admitted - limit.burst <= expected + 1, (admitted, expected)
