"""The YAML format: what loads, what it loads to, and the whole text of every refusal."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from sluice.errors import ConfigError
from sluice.model import DomainPolicy, RateLimit, Rule, Unit
from sluice.policies.yaml_format import dump_policies, dump_policy, load_path, load_text

LIMIT = (
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n"
    "      requests_per_unit: 1\n"
)


def load(text: str) -> list[DomainPolicy]:
    return load_text(textwrap.dedent(text), "t.yaml")


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(text)
    return info.value.problems


def test_loads_the_full_format() -> None:
    [policy] = load(
        """
        domain: d
        descriptors:
          - key: k
            value: v*
            share_threshold: true
            shadow_mode: true
            detailed_metric: true
            rate_limit:
              name: n
              unit: MINUTE
              requests_per_unit: 5
            descriptors:
              - key: inner
                rate_limit:
                  unlimited: true
          - key: other
            rate_limit:
              replaces:
                - name: n
              unit: second
              requests_per_unit: 1
        """
    )
    inner = Rule("inner", None, unlimited=True)
    assert policy == DomainPolicy(
        "d",
        (
            Rule(
                "k",
                "v*",
                (RateLimit(5, Unit.MINUTE, "n"),),
                name="n",
                shadow_mode=True,
                detailed_metric=True,
                share_threshold=True,
                descriptors=(inner,),
            ),
            Rule("other", None, (RateLimit(1, Unit.SECOND),), replaces=("n",)),
        ),
    )
    assert [r.line for r in policy.descriptors] == [4, 17]


def test_algorithms_bursts_and_several_limits() -> None:
    [policy] = load(
        """
        domain: d
        descriptors:
          - key: login
            rate_limit:
              unit: minute
              requests_per_unit: 3
              algorithm: gcra
          - key: api
            rate_limit:
              name: api
              limits:
                - {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 20}
                - {unit: day, requests_per_unit: 1000}
        """
    )
    login, api = policy.descriptors
    assert login.limits == (RateLimit(3, Unit.MINUTE, "", "gcra"),)
    assert api.limits == (
        RateLimit(10, Unit.SECOND, "api", "token_bucket", 20),
        RateLimit(1000, Unit.DAY, "api"),
    )
    assert load_text(dump_policies([policy]), "again") == [policy]


def test_numbers_and_booleans_as_values_keep_their_text() -> None:
    [policy] = load(
        """
        domain: d
        descriptors:
          - key: port
            value: 0080
            rate_limit: {unit: second, requests_per_unit: 1}
        """
    )
    assert policy.descriptors[0].value == "0080"


def test_every_unit_is_accepted() -> None:
    for unit in ("second", "minute", "hour", "day", "week", "month", "year"):
        [policy] = load(
            f"""
            domain: d
            descriptors:
              - key: k
                rate_limit: {{unit: {unit}, requests_per_unit: 1}}
            """
        )
        assert policy.descriptors[0].limits == (RateLimit(1, Unit[unit.upper()]),)


def test_several_documents_and_empty_ones() -> None:
    policies = load(
        """
        domain: a
        ---
        ---
        domain: b
        descriptors: []
        """
    )
    assert [p.domain for p in policies] == ["a", "b"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "domain: d\ndescriptors:\n  - key: [\n",
            ["t.yaml:4: YAML syntax error: expected the node content, but found '<stream end>'"],
            id="yaml-syntax",
        ),
        pytest.param(
            "- a\n- b\n", ["t.yaml:1: a policy document must be a mapping"], id="not-a-mapping"
        ),
        pytest.param(
            "domain: d\ncolour: red\n",
            ["t.yaml:2: unknown key 'colour' in a policy document"],
            id="unknown-root-key",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n"
            "      requests_per_unit: 1\n      colour: red\n",
            ["t.yaml:7: unknown key 'colour' in rate_limit"],
            id="unknown-rate-limit-key",
        ),
        pytest.param(
            "descriptors: []\n", ["t.yaml:1: config file cannot have empty domain"], id="no-domain"
        ),
        pytest.param(
            "domain: ''\n", ["t.yaml:1: config file cannot have empty domain"], id="empty-domain"
        ),
        pytest.param(
            "",
            ["t.yaml:1: config file cannot have empty domain (the file holds no policy)"],
            id="empty-file",
        ),
        pytest.param(
            "# limits to come\n---\n",
            ["t.yaml:1: config file cannot have empty domain (the file holds no policy)"],
            id="only-comments",
        ),
        pytest.param(
            "domain: d\n---\ndomain: d\n",
            [
                "t.yaml:3: duplicate domain 'd' (first defined at t.yaml:1; set "
                "MERGE_DOMAIN_CONFIG=true or --merge-domain-config to merge them)"
            ],
            id="duplicate-domain",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - value: v\n",
            ["t.yaml:3: descriptor has empty key"],
            id="empty-key",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
            ["t.yaml:5: duplicate descriptor composite key 'd.k_v'"],
            id="duplicate-composite-key",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: k\n"
            "      - key: k\n",
            ["t.yaml:6: duplicate descriptor composite key 'd.a.k'"],
            id="duplicate-nested-composite-key",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n"
            "      requests_per_unit: 1\n",
            ["t.yaml:5: invalid rate limit unit 'fortnight'"],
            id="bad-unit",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: unknown\n"
            "      requests_per_unit: 1\n",
            ["t.yaml:5: invalid rate limit unit 'unknown'"],
            id="unknown-unit",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 1\n",
            ["t.yaml:5: invalid rate limit unit ''"],
            id="missing-unit",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n"
            "      requests_per_unit: -1\n",
            ["t.yaml:6: 'requests_per_unit' must be between 0 and 4294967295"],
            id="negative-requests-per-unit",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n"
            "      requests_per_unit: ten\n",
            ["t.yaml:6: 'requests_per_unit' must be a whole number"],
            id="text-requests-per-unit",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n"
            "      unit: second\n",
            ["t.yaml:6: should not specify rate limit unit when unlimited"],
            id="unlimited-with-unit",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: sometimes\n",
            ["t.yaml:4: 'shadow_mode' must be true or false"],
            id="bad-boolean",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: n\n"
            "      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: n\n",
            ["t.yaml:9: replaces should not contain name of same descriptor"],
            id="replaces-itself",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n"
            "      requests_per_unit: 1\n      replaces:\n        - name: ''\n",
            ["t.yaml:8: should not have an empty replaces entry"],
            id="replaces-empty",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n"
            "      requests_per_unit: 1\n      replaces: n\n",
            ["t.yaml:7: 'replaces' must be a list of {name: ...} entries"],
            id="replaces-not-a-list",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: k\n    value: exact\n    share_threshold: true\n",
            [
                "t.yaml:5: share_threshold is only allowed on a descriptor whose value has a "
                "wildcard '*'"
            ],
            id="share-threshold-without-wildcard",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: k\n    value: '" + "*a" * 17 + "'\n",
            ["t.yaml:4: value has 17 wildcards '*', more than the maximum of 16"],
            id="too-many-wildcards",
        ),
        pytest.param(
            "domain: d\nlimit_overrides: sometimes\ndescriptors: []\n",
            ["t.yaml:2: 'limit_overrides' must be one of allow, ignore, deny"],
            id="limit-overrides-unknown",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: k\n    share_threshold: true\n",
            [
                "t.yaml:4: share_threshold is only allowed on a descriptor whose value has a "
                "wildcard '*'"
            ],
            id="share-threshold-on-key-only",
        ),
        pytest.param(
            "domain: d\ndescriptors: {key: k}\n",
            ["t.yaml:2: 'descriptors' must be a list"],
            id="descriptors-not-a-list",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n"
            "      unit: minute\n      requests_per_unit: 1\n",
            ["t.yaml:6: duplicate key 'unit' in rate_limit"],
            id="duplicate-key",
        ),
        pytest.param(
            LIMIT + "      algorithm: quantum\n",
            [
                "t.yaml:7: unknown algorithm 'quantum' (one of: fixed_window, sliding_window_log, "
                "sliding_window_counter, token_bucket, leaky_bucket, gcra)"
            ],
            id="unknown-algorithm",
        ),
        pytest.param(
            LIMIT + "      burst: 3\n",
            [
                "t.yaml:7: 'burst' applies only to token_bucket, leaky_bucket and gcra, not "
                "fixed_window"
            ],
            id="burst-on-fixed-window",
        ),
        pytest.param(
            LIMIT + "      algorithm: gcra\n      burst: 0\n",
            ["t.yaml:8: 'burst' must be a whole number from 1 to 4294967295"],
            id="burst-zero",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n"
            "      requests_per_unit: 10001\n      algorithm: sliding_window_log\n",
            [
                "t.yaml:6: sliding_window_log keeps one entry per request, so its "
                "requests_per_unit is capped at 10000; use sliding_window_counter for larger "
                "limits"
            ],
            id="sliding-log-over-cap",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n"
            "      limits:\n        - {unit: day, requests_per_unit: 1}\n",
            ["t.yaml:5: 'unit' belongs inside each entry of 'limits' when 'limits' is given"],
            id="limits-and-unit",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      limits: []\n",
            ["t.yaml:5: 'limits' must be a non-empty list of limits"],
            id="limits-empty",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      limits:\n"
            "        - {unit: day, requests_per_unit: 1}\n"
            "        - {unit: day, requests_per_unit: 2}\n",
            [
                "t.yaml:7: two limits with algorithm fixed_window per day (the other is on "
                "line 6): they would share one counter"
            ],
            id="limits-duplicate",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n"
            "      algorithm: gcra\n",
            ["t.yaml:6: 'algorithm' has no meaning when unlimited"],
            id="unlimited-with-algorithm",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n"
            "      requests_per_unit: 1\n      algorithm: gcra\n      calendar: true\n",
            [
                "t.yaml:8: 'calendar' needs an algorithm that counts in windows (fixed_window "
                "or sliding_window_counter); gcra has no window to align to the calendar"
            ],
            id="calendar-gcra",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: hour\n"
            "      requests_per_unit: 1\n      calendar: true\n",
            [
                "t.yaml:7: 'calendar' applies to day, week, month and year limits, not hour "
                "(whose windows are not calendar periods)"
            ],
            id="calendar-hour",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n"
            "      requests_per_unit: 1\n      timezone: Europe/Paris\n",
            ["t.yaml:7: 'timezone' applies only with 'calendar: true'"],
            id="timezone-without-calendar",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n"
            "      requests_per_unit: 1\n      calendar: true\n      timezone: Europe/Pariss\n",
            [
                "t.yaml:8: unknown timezone 'Europe/Pariss' (an IANA time zone name such as "
                "Europe/Paris)"
            ],
            id="timezone-unknown",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n"
            "      requests_per_unit: 1\n      calendar: yes please\n",
            ["t.yaml:7: 'calendar' must be true or false"],
            id="calendar-not-a-boolean",
        ),
        pytest.param(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n"
            "      calendar: true\n",
            ["t.yaml:6: 'calendar' has no meaning when unlimited"],
            id="unlimited-with-calendar",
        ),
    ],
)
def test_refusals_name_the_line_and_the_reason(text: str, expected: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(text, "t.yaml")
    assert info.value.problems == expected


def test_every_problem_is_reported_at_once() -> None:
    assert problems(
        """
        domain: d
        descriptors:
          - key: a
            rate_limit: {unit: lightyear, requests_per_unit: 1}
          - key: ''
        """
    ) == [
        "t.yaml:5: invalid rate limit unit 'lightyear'",
        "t.yaml:6: descriptor has empty key",
    ]


def test_a_directory_loads_every_yaml_file_and_a_bad_file_loads_nothing(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("domain: a\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.yml").write_text("domain: b\n")
    (tmp_path / "notes.txt").write_text("not policy")
    assert [p.domain for p in load_path(tmp_path)] == ["a", "b"]

    (tmp_path / "sub" / "c.yaml").write_text("domain: a\n")
    with pytest.raises(ConfigError) as info:
        load_path(tmp_path)
    assert info.value.problems == [
        f"{tmp_path / 'sub' / 'c.yaml'}:1: duplicate domain 'a' (first defined at "
        f"{tmp_path / 'a.yaml'}:1; set MERGE_DOMAIN_CONFIG=true or --merge-domain-config to "
        f"merge them)"
    ]


def test_a_directory_skips_hidden_files_and_directories(tmp_path: Path) -> None:
    # A Kubernetes ConfigMap mount: the file under ..<timestamp>, ..data a link to it, and
    # the visible name a link through ..data. Read once, not three times (a duplicate).
    version = tmp_path / "..2026_11_25_13_00_00.000000001"
    version.mkdir()
    (version / "config.yaml").write_text("domain: a\n")
    (tmp_path / "..data").symlink_to(version.name)
    (tmp_path / "config.yaml").symlink_to("..data/config.yaml")
    (tmp_path / ".editor.yaml").write_text("domain: b\n")
    assert [p.domain for p in load_path(tmp_path)] == ["a"]
    # The path given is read even when it is hidden itself.
    assert [p.domain for p in load_path(version)] == ["a"]


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_path(tmp_path / "nope.yaml")
    assert info.value.problems == [f"{tmp_path / 'nope.yaml'}: no such file or directory"]


def test_dump_then_load_gives_the_same_policies() -> None:
    text = Path(__file__).parents[3].joinpath("examples", "ratelimit.yaml").read_text()
    original = load_text(text, "example")
    assert load_text(dump_policies(original), "dump") == original


def test_calendar_windows_apply_to_every_limit_of_the_block_and_dump_back() -> None:
    text = (
        "domain: ai\ndescriptors:\n  - key: tenant\n    rate_limit:\n      calendar: true\n"
        "      timezone: America/New_York\n      limits:\n"
        "        - {unit: month, requests_per_unit: 1000000}\n"
        "        - {unit: day, requests_per_unit: 50000, algorithm: sliding_window_counter}\n"
        "  - key: plan\n    rate_limit: {unit: year, requests_per_unit: 9, calendar: true}\n"
    )
    (policy,) = load_text(text, "t.yaml")
    tenant, plan = policy.descriptors
    assert [limit.timezone for limit in tenant.limits] == ["America/New_York"] * 2
    assert plan.limits[0].timezone == "UTC"  # the default zone
    dumped = dump_policy(policy)
    assert "calendar: true\n    timezone: America/New_York" in dumped
    assert "timezone: UTC" not in dumped
    assert load_text(dumped, "dump") == [policy]


def test_a_value_may_have_up_to_sixteen_wildcards() -> None:
    text = "domain: d\ndescriptors:\n  - key: k\n    value: '" + "*a" * 16 + "'\n"
    (policy,) = load_text(text, "t.yaml")
    assert policy.descriptors[0].value == "*a" * 16


@pytest.mark.parametrize("mode", ["allow", "ignore", "deny"])
def test_a_domain_says_what_it_does_with_client_limits(mode: str) -> None:
    (policy,) = load_text(f"domain: d\nlimit_overrides: {mode}\ndescriptors: []\n", "t.yaml")
    assert policy.limit_overrides == mode
    assert load_text(dump_policy(policy), "again.yaml") == [policy]


def test_merge_domains_adds_each_files_top_level_descriptors(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(
        "domain: d\ndescriptors:\n  - key: k\n"
        "    rate_limit: {unit: second, requests_per_unit: 1}\n"
        "    descriptors:\n      - key: inner\n"
        "        rate_limit: {name: inner, unit: second, requests_per_unit: 2}\n"
    )
    (tmp_path / "b.yaml").write_text(
        "domain: d\ndescriptors:\n  - key: k\n    value: v\n"
        "    rate_limit: {replaces: [{name: inner}], unit: minute, requests_per_unit: 3}\n"
    )
    warnings: list[str] = []
    [policy] = load_path(tmp_path, merge_domains=True, warnings=warnings)
    assert [(r.key, r.value) for r in policy.descriptors] == [("k", None), ("k", "v")]
    assert policy.descriptors[1].limits == (RateLimit(3, Unit.MINUTE),)
    assert warnings == []  # replaces may name a limit of the other file


def test_merge_domains_refuses_a_top_level_descriptor_defined_twice(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(LIMIT)
    (tmp_path / "b.yaml").write_text("domain: other\n---\n" + LIMIT)
    with pytest.raises(ConfigError) as info:
        load_path(tmp_path, merge_domains=True)
    assert info.value.problems == [
        f"{tmp_path / 'b.yaml'}:5: duplicate descriptor composite key 'd.k' (also at "
        f"{tmp_path / 'a.yaml'}:3) in merged domain 'd'"
    ]


def test_merge_domains_refuses_two_different_limit_overrides(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("domain: d\nlimit_overrides: deny\n")
    (tmp_path / "b.yaml").write_text("domain: d\nlimit_overrides: allow\n")
    with pytest.raises(ConfigError) as info:
        load_path(tmp_path, merge_domains=True)
    assert info.value.problems == [
        f"{tmp_path / 'b.yaml'}:1: limit_overrides 'allow' differs from 'deny' at "
        f"{tmp_path / 'a.yaml'}:1 in merged domain 'd'"
    ]
