"""Scenarios from envoyproxy/ratelimit's own tests, replayed against a live `sluice serve`.

Every scenario is data: the requests (domain, descriptors, hits_addend, limit overrides) and
the answers envoyproxy/ratelimit gives (overall code; per descriptor: code, current_limit,
limit_remaining), with the upstream file it was taken from. The configs are in ./scenarios,
one file per upstream fixture, all loaded by one server.

Windows are epoch-aligned and the server uses the real clock, so nothing sleeps:
  * a value containing ``{u}`` is replaced by a token unique to the attempt, so no two
    scenarios (or attempts) share a counter;
  * the client reads the clock before the first and after the last request; when a window of
    the shortest unit in the scenario ended in between (the server's reads lie in between), the
    scenario is replayed with fresh tokens, provided every counter it checks is a fresh one;
  * scenarios that must use a fixed value (an exact ``value:`` rule) hit each such counter at
    most once, or use hour/day units;
  * duration_until_reset is only checked to lie in (0, unit].

Where Sluice deliberately answers differently, the scenario is not here but in the tests of
that behaviour (see docs/configuration.md): a descriptor without entries is INVALID_ARGUMENT
(upstream: OK, no limit; tests/integration/test_grpc_server.py). Upstream's newer keys
(quota_mode, middle wildcards, value_to_metric...) are in tests/unit/test_upstream_yaml.py.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from sluice._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from sluice._proto.envoy.type.v3 import ratelimit_unit_pb2
from tests.support.processes import SluiceProcess, sluice_serve

SCENARIOS_DIR = Path(__file__).parent / "scenarios"
U = "{u}"  # replaced by a per-attempt unique token
MAX_UINT32 = 2**32 - 1
UNIT_SECONDS = {"SECOND": 1, "MINUTE": 60, "HOUR": 3600, "DAY": 86400}
MAX_ATTEMPTS = 5

Code = rls_pb2.RateLimitResponse
UnitEnum = rls_pb2.RateLimitResponse.RateLimit


# --- the data model -----------------------------------------------------------------------


@dataclass(frozen=True)
class D:
    """One request descriptor."""

    entries: tuple[tuple[str, str], ...]
    hits_addend: int | None = None  # the descriptor's own hits_addend (UInt64Value)
    override: tuple[int, str] | None = None  # RateLimitOverride (requests_per_unit, unit)


@dataclass(frozen=True)
class S:
    """One expected descriptor status."""

    code: str  # "OK" or "OVER_LIMIT"
    limit: tuple[int, str, str] | None = None  # (requests_per_unit, unit, name)
    remaining: int = 0


@dataclass(frozen=True)
class Step:
    domain: str
    descriptors: tuple[D, ...]
    overall: str
    statuses: tuple[S, ...]
    hits_addend: int = 0  # the request's hits_addend


@dataclass(frozen=True)
class Scenario:
    id: str
    source: str
    steps: tuple[Step, ...]


def d(
    *entries: tuple[str, str], hits: int | None = None, override: tuple[int, str] | None = None
) -> D:
    return D(tuple(entries), hits, override)


def ok(limit: tuple[int, str, str] | tuple[int, str] | None = None, remaining: int = 0) -> S:
    return S("OK", _limit(limit), remaining)


def over(limit: tuple[int, str, str] | tuple[int, str]) -> S:
    return S("OVER_LIMIT", _limit(limit), 0)


def _limit(limit: tuple | None) -> tuple[int, str, str] | None:
    if limit is None:
        return None
    return (limit[0], limit[1], limit[2] if len(limit) > 2 else "")


NO_LIMIT = S("OK")
UNLIMITED = S("OK", None, MAX_UINT32)


def step(domain: str, descriptors: list[D], statuses: list[S], *, hits_addend: int = 0) -> Step:
    overall = "OVER_LIMIT" if any(s.code == "OVER_LIMIT" for s in statuses) else "OK"
    return Step(domain, tuple(descriptors), overall, tuple(statuses), hits_addend)


def counting(
    domain: str, desc: D, limit: tuple[int, str], n: int, *, shadow: bool = False
) -> list[Step]:
    """n single-descriptor hits of 1 on a fresh counter: remaining counts down, then 0.

    Over the limit the status is OVER_LIMIT, or OK with 0 remaining for a shadow_mode rule.
    """
    steps = []
    for i in range(n):
        if i < limit[0]:
            status = ok(limit, limit[0] - (i + 1))
        else:
            status = ok(limit, 0) if shadow else over(limit)
        steps.append(step(domain, [desc], [status]))
    return steps


# --- the scenarios ------------------------------------------------------------------------

INTEGRATION = "test/integration/integration_test.go (testBasicBaseConfig)"
CONFIG_TEST = "test/config/config_test.go"
SERVICE_TEST = "test/service/ratelimit_test.go"
REDIS_TEST = "test/redis/fixed_cache_impl_test.go"


def _integration_two_keys() -> list[Step]:
    steps = []
    for i in range(15):
        key3 = ok((10, "HOUR"), 10 - (i + 1)) if i < 10 else over((10, "HOUR"))
        steps.append(
            step(
                "another",
                [d(("key2", U)), d(("key3", U))],
                [ok((20, "MINUTE"), 20 - (i + 1)), key3],
            )
        )
    return steps


SCENARIOS: list[Scenario] = [
    # ---- test/integration/integration_test.go ----
    Scenario(
        "integration-unknown-domain",
        f"{INTEGRATION}: domain 'foo', hello=world -> OK, no current_limit, remaining 0",
        (step("foo", [d(("hello", "world"))], [NO_LIMIT]),),
    ),
    Scenario(
        "integration-basic-first-hit",
        f"{INTEGRATION}: domain 'basic', key1=foo -> OK 50/SECOND remaining 49 "
        "(value made unique: 'foo-{u}')",
        (step("basic", [d(("key1", "foo-" + U))], [ok((50, "SECOND"), 49)]),),
    ),
    Scenario(
        "integration-another-over-limit",
        f"{INTEGRATION}: domain 'another', 25 x key2=<random>: 20 OK (remaining 19..0), "
        "then OVER_LIMIT with remaining 0",
        tuple(counting("another", d(("key2", U)), (20, "MINUTE"), 25)),
    ),
    Scenario(
        "integration-two-descriptors-overall-over-limit",
        f"{INTEGRATION}: 15 x [key2=<r>], [key3=<r>]: key2 20/MINUTE stays OK; key3 10/HOUR "
        "goes OVER_LIMIT at the 11th, which makes the overall code OVER_LIMIT",
        tuple(_integration_two_keys()),
    ),
    # ---- test/config/config_test.go TestBasicConfig (basic_config.yaml) ----
    Scenario(
        "config-value-without-rule",
        f"{CONFIG_TEST} TestBasicConfig: key1=something -> nil (only key1=value1 exists)",
        (step("test-domain", [d(("key1", "something"))], [NO_LIMIT]),),
    ),
    Scenario(
        "config-depth-shallower-than-config",
        f"{CONFIG_TEST} TestBasicConfig: key1=value1 -> nil (the limit sits one level deeper)",
        (step("test-domain", [d(("key1", "value1"))], [NO_LIMIT]),),
    ),
    Scenario(
        "config-depth-deeper-than-config",
        f"{CONFIG_TEST} TestBasicConfig: [key2=value2, subkey=subvalue] -> nil and "
        "[key5=value5, subkey5=subvalue] -> nil (request deeper than the matching rules)",
        (
            step("test-domain", [d(("key2", "value2"), ("subkey", "subvalue"))], [NO_LIMIT]),
            step("test-domain", [d(("key5", "value5"), ("subkey5", "subvalue"))], [NO_LIMIT]),
        ),
    ),
    Scenario(
        "config-whitelisted-value",
        f"{CONFIG_TEST} TestBasicConfig: key2=value3 -> nil (a rule with no limit whitelists "
        "the value over key-only key2); deeper requests stop there too (no children)",
        (
            step("test-domain", [d(("key2", "value3"))], [NO_LIMIT]),
            step("test-domain", [d(("key2", "value3"), ("subkey", "x" + U))], [NO_LIMIT]),
        ),
    ),
    Scenario(
        "config-key-only-per-value-counters",
        f"{CONFIG_TEST} TestBasicConfig: [key1=value1, subkey1=something] -> 5/SECOND "
        "(key-only subkey1); counters are per request value (src/limiter/cache_key.go)",
        (
            step(
                "test-domain", [d(("key1", "value1"), ("subkey1", "a" + U))], [ok((5, "SECOND"), 4)]
            ),
            step(
                "test-domain", [d(("key1", "value1"), ("subkey1", "b" + U))], [ok((5, "SECOND"), 4)]
            ),
            step(
                "test-domain", [d(("key1", "value1"), ("subkey1", "a" + U))], [ok((5, "SECOND"), 3)]
            ),
        ),
    ),
    Scenario(
        "config-exact-beats-key-only",
        f"{CONFIG_TEST} TestBasicConfig: [key1=value1, subkey1=subvalue1] -> 10/SECOND; "
        "key2=value2 -> 30/MINUTE; key2=something -> 20/MINUTE",
        (
            step(
                "test-domain",
                [d(("key1", "value1"), ("subkey1", "subvalue1"))],
                [ok((10, "SECOND"), 9)],
            ),
            step("test-domain", [d(("key2", "value2"))], [ok((30, "MINUTE"), 29)]),
            step("test-domain", [d(("key2", "something" + U))], [ok((20, "MINUTE"), 19)]),
        ),
    ),
    Scenario(
        "config-basic-limit-then-over-hour",
        f"{CONFIG_TEST} TestBasicConfig: key3=foo -> 1/HOUR; one hit allowed, then OVER_LIMIT; "
        "another value has its own counter",
        (
            *counting("test-domain", d(("key3", "foo" + U)), (1, "HOUR"), 3),
            step("test-domain", [d(("key3", "bar" + U))], [ok((1, "HOUR"), 0)]),
        ),
    ),
    Scenario(
        "config-basic-limit-then-over-day",
        f"{CONFIG_TEST} TestBasicConfig: key4=foo -> 1/DAY",
        tuple(counting("test-domain", d(("key4", "foo" + U)), (1, "DAY"), 3)),
    ),
    Scenario(
        "config-nested-descriptors",
        f"{CONFIG_TEST} TestBasicConfig / basic_config.yaml: key5=value5 has its own 15/DAY "
        "and a child subkey5=subvalue5 with 25/DAY; each level counts separately",
        (
            step("test-domain", [d(("key5", "value5"))], [ok((15, "DAY"), 14)]),
            step(
                "test-domain",
                [d(("key5", "value5"), ("subkey5", "subvalue5"))],
                [ok((25, "DAY"), 24)],
            ),
            step(
                "test-domain",
                [d(("key5", "value5")), d(("key5", "value5"), ("subkey5", "subvalue5"))],
                [ok((15, "DAY"), 13), ok((25, "DAY"), 23)],
            ),
        ),
    ),
    # ---- rejected hits still count (Redis INCRBY always runs) ----
    Scenario(
        "rejected-hits-still-count",
        "src/redis/fixed_cache_impl.go + src/limiter/base_limiter.go: every hit is INCRBY'd, "
        "rejected ones included; the cache key is domain+entries+window "
        "(src/limiter/cache_key.go), so an override with the same unit reads the same "
        "counter: after 3 hits on a 1/HOUR rule, an override of 5/HOUR sees its 4th hit",
        (
            *counting("test-domain", d(("key3", "r" + U)), (1, "HOUR"), 3),
            step("test-domain", [d(("key3", "r" + U), override=(5, "HOUR"))], [ok((5, "HOUR"), 1)]),
        ),
    ),
    # ---- TestConfigLimitOverride ----
    Scenario(
        "override-unknown-domain-ignored",
        f"{CONFIG_TEST} TestConfigLimitOverride: no matching domain -> nil, even with an override",
        (step("foo_domain", [d(("key1", "value1"), override=(10, "DAY"))], [NO_LIMIT]),),
    ),
    Scenario(
        "override-replaces-configured-limit",
        f"{CONFIG_TEST} TestConfigLimitOverride: [key1=value1, subkey1=something] with override "
        "10/DAY -> 10/DAY (not the configured 5/SECOND); a different value with 42/HOUR -> its "
        "own counter",
        (
            step(
                "test-domain",
                [d(("key1", "value1"), ("subkey1", "s" + U), override=(10, "DAY"))],
                [ok((10, "DAY"), 9)],
            ),
            step(
                "test-domain",
                [d(("key1", "value1"), ("subkey1", "s" + U), override=(10, "DAY"))],
                [ok((10, "DAY"), 8)],
            ),
            step(
                "test-domain",
                [d(("key1", "value1"), ("subkey1", "e" + U), override=(42, "HOUR"))],
                [ok((42, "HOUR"), 41)],
            ),
        ),
    ),
    Scenario(
        "override-on-unmatched-descriptor",
        "src/config/config_impl.go GetLimit: in a known domain the override is returned before "
        "any rule lookup, so it applies to a descriptor no rule matches",
        tuple(counting("test-domain", d(("nomatch", U), override=(2, "HOUR")), (2, "HOUR"), 3)),
    ),
    Scenario(
        "override-not-shadowed",
        "src/config/config_impl.go GetLimit: 'When limit override is provided by envoy config, "
        "we don't want to enable shadow_mode' -> key2 (a shadow_mode rule) with an override "
        "is enforced",
        tuple(
            counting("test-domain-shadowmode", d(("key2", U), override=(1, "HOUR")), (1, "HOUR"), 2)
        ),
    ),
    # ---- shadow mode: TestShadowModeConfig + base_limiter.go ----
    Scenario(
        "shadow-mode-over-limit-reported-ok",
        f"{CONFIG_TEST} TestShadowModeConfig: key2=something is shadow_mode 20/MINUTE; "
        "src/limiter/base_limiter.go: over the limit the code becomes OK, limit_remaining stays 0",
        tuple(counting("test-domain-shadowmode", d(("key2", U)), (20, "MINUTE"), 22, shadow=True)),
    ),
    Scenario(
        "shadow-mode-rules-under-limit",
        f"{CONFIG_TEST} TestShadowModeConfig: [key1=value1, subkey1=subvalue1] -> 10/SECOND "
        "(shadow); key2=value2 -> 30/MINUTE (not shadow)",
        (
            step(
                "test-domain-shadowmode",
                [d(("key1", "value1"), ("subkey1", "subvalue1"))],
                [ok((10, "SECOND"), 9)],
            ),
            step("test-domain-shadowmode", [d(("key2", "value2"))], [ok((30, "MINUTE"), 29)]),
        ),
    ),
    Scenario(
        "shadow-mode-mixed-with-enforced",
        f"{SERVICE_TEST} TestMixedRuleShadowMode: a shadow_mode descriptor over its limit (OK) "
        "next to an enforced one over its limit (OVER_LIMIT) -> overall OVER_LIMIT",
        (
            *counting("test-domain-shadowmode", d(("key2", U)), (20, "MINUTE"), 20),
            *[
                step(
                    "test-domain-shadowmode",
                    [d(("key2", U)), d(("key1", "value1"), ("subkey1", U))],
                    [
                        ok((20, "MINUTE"), 0),
                        ok((5, "SECOND"), 4 - i) if i < 5 else over((5, "SECOND")),
                    ],
                )
                for i in range(6)
            ],
        ),
    ),
    # ---- wildcard: TestWildcardConfig ----
    Scenario(
        "wildcard-prefix-match-per-value-counters",
        f"{CONFIG_TEST} TestWildcardConfig: wild=foo1 and wild=foo2 both match 'foo*' with "
        "equal limits; the cache key uses the request's value, so each value counts alone",
        (
            step("test-domain-wildcard", [d(("wild", "foo1" + U))], [ok((20, "MINUTE"), 19)]),
            step("test-domain-wildcard", [d(("wild", "foo2" + U))], [ok((20, "MINUTE"), 19)]),
            step("test-domain-wildcard", [d(("wild", "foo1" + U))], [ok((20, "MINUTE"), 18)]),
        ),
    ),
    Scenario(
        "wildcard-matches-bare-prefix",
        "src/config/config_impl.go GetLimit: a wildcard matches by strings.HasPrefix on the "
        "value without '*', so 'foo*' matches 'foo' itself",
        (step("test-domain-wildcard", [d(("wild", "foo"))], [ok((20, "MINUTE"), 19)]),),
    ),
    Scenario(
        "wildcard-no-match",
        f"{CONFIG_TEST} TestWildcardConfig: wild=bar -> nil",
        (step("test-domain-wildcard", [d(("wild", "bar" + U))], [NO_LIMIT]),),
    ),
    Scenario(
        "wildcard-exact-value-no-eager-match",
        f"{CONFIG_TEST} TestWildcardConfig: noWild=foo1 -> nil ('foo' is not a prefix rule); "
        "noWild=foo -> 20/MINUTE",
        (
            step("test-domain-wildcard", [d(("noWild", "foo1" + U))], [NO_LIMIT]),
            step("test-domain-wildcard", [d(("noWild", "foo"))], [ok((20, "MINUTE"), 19)]),
        ),
    ),
    Scenario(
        "wildcard-key-only-baseline",
        f"{CONFIG_TEST} TestWildcardConfig: noVal=foo1 and noVal=foo2 -> the same key-only limit",
        (
            step("test-domain-wildcard", [d(("noVal", "foo1" + U))], [ok((20, "MINUTE"), 19)]),
            step("test-domain-wildcard", [d(("noVal", "foo2" + U))], [ok((20, "MINUTE"), 19)]),
        ),
    ),
    Scenario(
        "wildcard-in-middle-literal-value",
        "src/config/config_impl.go: 'bar*b' is an exact value, so a request value 'bar*b' "
        "matches it",
        (step("test-domain-wildcard", [d(("midWild", "bar*b"))], [ok((20, "MINUTE"), 19)]),),
    ),
    # ---- unlimited: TestUnlimited ----
    Scenario(
        "unlimited",
        f"{SERVICE_TEST} TestUnlimited: [foo=bar] 10/MINUTE remaining 9, [hello=world] no "
        "limit remaining 0, [baz=qux] unlimited -> OK, no current_limit, remaining MaxUint32; "
        "unlimited descriptors never reach the cache",
        (
            step(
                "some-domain",
                [d(("foo", "bar" + U)), d(("hello", "world")), d(("baz", "qux"))],
                [ok((10, "MINUTE"), 9), NO_LIMIT, UNLIMITED],
            ),
            step(
                "some-domain",
                [d(("foo", "bar" + U)), d(("hello", "world")), d(("baz", "qux"))],
                [ok((10, "MINUTE"), 8), NO_LIMIT, UNLIMITED],
            ),
        ),
    ),
    # ---- replaces: src/service/ratelimit.go constructLimitsToCheck ----
    Scenario(
        "replaces-named-limit-not-consumed",
        "src/service/ratelimit.go constructLimitsToCheck: premium_plan replaces per_user, so "
        "per_user is not checked (OK, no current_limit, remaining 0) and its counter is not "
        "consumed; alone, per_user applies again",
        (
            step(
                "replaces",
                [d(("user", "a" + U)), d(("plan", "premium"))],
                [NO_LIMIT, ok((3, "HOUR", "premium_plan"), 2)],
            ),
            step(
                "replaces",
                [d(("user", "a" + U)), d(("plan", "premium"))],
                [NO_LIMIT, ok((3, "HOUR", "premium_plan"), 1)],
            ),
            step("replaces", [d(("user", "a" + U))], [ok((1, "HOUR", "per_user"), 0)]),
            step("replaces", [d(("user", "a" + U))], [over((1, "HOUR", "per_user"))]),
        ),
    ),
    Scenario(
        "replaces-by-unlimited-limit",
        "src/service/ratelimit.go constructLimitsToCheck: `replaces` are collected from every "
        "matched limit before unlimited ones are dropped, so an unlimited limit's replaces "
        "still apply: per_user is not checked next to plan=internal",
        (
            step(
                "replaces", [d(("user", "b" + U)), d(("plan", "internal"))], [NO_LIMIT, UNLIMITED]
            ),
            step(
                "replaces", [d(("user", "b" + U)), d(("plan", "internal"))], [NO_LIMIT, UNLIMITED]
            ),
            step("replaces", [d(("user", "b" + U))], [ok((1, "HOUR", "per_user"), 0)]),
        ),
    ),
    # ---- hits_addend ----
    Scenario(
        "request-hits-addend-zero-means-one",
        "src/utils/utilities.go GetHitsAddends: request hits_addend 0 (unset) counts as 1",
        (
            step("hits-addend", [d(("ten", U))], [ok((10, "HOUR"), 9)], hits_addend=0),
            step("hits-addend", [d(("ten", U))], [ok((10, "HOUR"), 8)], hits_addend=0),
        ),
    ),
    Scenario(
        "request-hits-addend-consumes-n",
        f"{REDIS_TEST} TestNearLimit: INCRBY 3 to 5 on 20 -> remaining 15; INCRBY 2 to 7 on 8 -> "
        "remaining 1; INCRBY 3 to 22 on 20 -> OVER_LIMIT; INCRBY 3 to 30 on 10 -> OVER_LIMIT; "
        "and 5 on 10 -> remaining 5",
        (
            step("hits-addend", [d(("twenty", "a" + U))], [ok((20, "HOUR"), 18)], hits_addend=2),
            step("hits-addend", [d(("twenty", "a" + U))], [ok((20, "HOUR"), 15)], hits_addend=3),
            step("hits-addend", [d(("eight", U))], [ok((8, "HOUR"), 3)], hits_addend=5),
            step("hits-addend", [d(("eight", U))], [ok((8, "HOUR"), 1)], hits_addend=2),
            step("hits-addend", [d(("twenty", "b" + U))], [ok((20, "HOUR"), 1)], hits_addend=19),
            step("hits-addend", [d(("twenty", "b" + U))], [over((20, "HOUR"))], hits_addend=3),
            step("hits-addend", [d(("ten", "a" + U))], [over((10, "HOUR"))], hits_addend=27),
            step("hits-addend", [d(("ten", "a" + U))], [over((10, "HOUR"))], hits_addend=3),
            step("hits-addend", [d(("ten", "b" + U))], [ok((10, "HOUR"), 5)], hits_addend=5),
        ),
    ),
    Scenario(
        "descriptor-hits-addend-wins",
        f"{REDIS_TEST} testRedis: per-descriptor hits [0, 1] for [key2=value2] (no limit) and "
        "[key2=value2, subkey2=subvalue2] (10, counter at 10) -> [OK no limit, OVER_LIMIT]",
        (
            step(
                "hits-addend",
                [d(("key2", U), ("subkey2", U))],
                [ok((10, "HOUR"), 0)],
                hits_addend=10,
            ),
            step(
                "hits-addend",
                [d(("key2", U), hits=0), d(("key2", U), ("subkey2", U), hits=1)],
                [NO_LIMIT, over((10, "HOUR"))],
                hits_addend=1,
            ),
        ),
    ),
    Scenario(
        "descriptor-hits-addend-zero-checks-only",
        f"{REDIS_TEST} testRedis: per-descriptor hits [0, 1], key3 counter at 11 of 10 (INCRBY 0) "
        "and its child at 13 of 10 -> both OVER_LIMIT; src/utils/utilities.go: 'The zero value "
        "means check only by no increment the hits'",
        (
            step("hits-addend", [d(("key3", U))], [over((10, "HOUR"))], hits_addend=11),
            step(
                "hits-addend", [d(("key3", U), ("subkey3", U))], [over((10, "DAY"))], hits_addend=12
            ),
            step(
                "hits-addend",
                [d(("key3", U), hits=0), d(("key3", U), ("subkey3", U), hits=1)],
                [over((10, "HOUR")), over((10, "DAY"))],
            ),
            # Check-only below the limit: the remaining count does not move.
            step("hits-addend", [d(("key3", "c" + U))], [ok((10, "HOUR"), 6)], hits_addend=4),
            step("hits-addend", [d(("key3", "c" + U), hits=0)], [ok((10, "HOUR"), 6)]),
            step(
                "hits-addend", [d(("key3", "c" + U), hits=0)], [ok((10, "HOUR"), 6)], hits_addend=5
            ),
            step("hits-addend", [d(("key3", "c" + U))], [ok((10, "HOUR"), 5)]),
        ),
    ),
    Scenario(
        "descriptor-hits-addend-overrides-request",
        "src/utils/utilities.go GetHitsAddends: the request's hits_addend applies where a "
        "descriptor sets none; a descriptor's own value (here 2, then 0) wins",
        (
            step(
                "hits-addend",
                [d(("ten", "a" + U)), d(("ten", "b" + U), hits=2)],
                [ok((10, "HOUR"), 5), ok((10, "HOUR"), 8)],
                hits_addend=5,
            ),
            step(
                "hits-addend",
                [d(("ten", "a" + U), hits=0), d(("ten", "b" + U))],
                [ok((10, "HOUR"), 5), ok((10, "HOUR"), 3)],
                hits_addend=5,
            ),
        ),
    ),
    # ---- a limit of 0 ----
    Scenario(
        "zero-limit-always-over",
        "src/limiter/base_limiter.go GetResponseDescriptorStatus: OVER_LIMIT iff count after "
        "INCRBY > requests_per_unit, so 0 refuses every counted hit; a check-only hit (0) "
        "leaves the count at 0: OK, remaining 0",
        (
            step("zero-limit", [d(("blocked", U))], [over((0, "HOUR"))]),
            step("zero-limit", [d(("blocked", U))], [over((0, "HOUR"))], hits_addend=3),
            step("zero-limit", [d(("blocked", "c" + U), hits=0)], [ok((0, "HOUR"), 0)]),
        ),
    ),
]


# --- running them -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    with sluice_serve(tmp_path_factory.mktemp("envoy-scenarios"), config=SCENARIOS_DIR) as process:
        yield process


@pytest.fixture(scope="module")
def stub(server: SluiceProcess) -> Iterator[rls_pb2_grpc.RateLimitServiceStub]:
    with grpc.insecure_channel(server.grpc_target) as channel:
        yield rls_pb2_grpc.RateLimitServiceStub(channel)


def _request(s: Step, token: str) -> rls_pb2.RateLimitRequest:
    request = rls_pb2.RateLimitRequest(domain=s.domain, hits_addend=s.hits_addend)
    for desc in s.descriptors:
        out = request.descriptors.add()
        for key, value in desc.entries:
            out.entries.append(
                ratelimit_pb2.RateLimitDescriptor.Entry(key=key, value=value.replace(U, token))
            )
        if desc.hits_addend is not None:
            out.hits_addend.value = desc.hits_addend
        if desc.override is not None:
            rpu, unit = desc.override
            out.limit.requests_per_unit = rpu
            out.limit.unit = ratelimit_unit_pb2.RateLimitUnit.Value(unit)
    return request


def _shortest_window(scenario: Scenario) -> int | None:
    units = [
        UNIT_SECONDS[st.limit[1]]
        for s in scenario.steps
        for st in s.statuses
        if st.limit is not None
    ]
    return min(units) if units else None


def _retryable(scenario: Scenario) -> bool:
    """True when every counter the scenario checks is unique to the attempt."""
    return all(
        any(U in value for _, value in desc.entries)
        for s in scenario.steps
        for desc, st in zip(s.descriptors, s.statuses, strict=True)
        if st.limit is not None
    )


def _replay(stub, scenario: Scenario) -> list[rls_pb2.RateLimitResponse]:
    window = _shortest_window(scenario)
    for attempt in range(MAX_ATTEMPTS):
        token = f"{uuid.uuid4().hex[:10]}-{attempt}"
        t0 = time.time()
        responses = [stub.ShouldRateLimit(_request(s, token), timeout=10) for s in scenario.steps]
        t1 = time.time()
        crossed = window is not None and int(t0 // window) != int(t1 // window)
        if not crossed or not _retryable(scenario):
            return responses
    return responses  # five boundary crossings in a row: assert what we have


def _check(scenario: Scenario, responses: list[rls_pb2.RateLimitResponse]) -> None:
    for i, (s, response) in enumerate(zip(scenario.steps, responses, strict=True)):
        where = f"{scenario.id} step {i + 1}"
        assert Code.Code.Name(response.overall_code) == s.overall, (
            f"{where}: overall_code\n{response}"
        )
        assert len(response.statuses) == len(s.statuses), f"{where}: number of statuses"
        for j, (got, want) in enumerate(zip(response.statuses, s.statuses, strict=True)):
            at = f"{where} status {j}"
            assert Code.Code.Name(got.code) == want.code, f"{at}: code\n{response}"
            assert got.limit_remaining == want.remaining, f"{at}: limit_remaining\n{response}"
            if want.limit is None:
                assert not got.HasField("current_limit"), f"{at}: current_limit\n{response}"
                assert not got.HasField("duration_until_reset"), f"{at}: duration\n{response}"
                continue
            rpu, unit, name = want.limit
            assert got.HasField("current_limit"), f"{at}: current_limit missing\n{response}"
            assert got.current_limit.requests_per_unit == rpu, f"{at}: requests_per_unit"
            assert UnitEnum.Unit.Name(got.current_limit.unit) == unit, f"{at}: unit"
            assert got.current_limit.name == name, f"{at}: name"
            seconds = got.duration_until_reset.seconds
            assert 0 < seconds <= UNIT_SECONDS[unit], f"{at}: duration_until_reset {seconds}s"


def test_scenario_ids_are_unique() -> None:
    ids = [s.id for s in SCENARIOS]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.id for s in SCENARIOS])
def test_envoy_ratelimit_scenario(stub, scenario: Scenario) -> None:
    _check(scenario, _replay(stub, scenario))
