"""The per-descriptor lists of a policy document: overrides, blocks, allows, resets."""

from __future__ import annotations

import textwrap

import pytest

from sluice.errors import ConfigError
from sluice.model import Pin, RateLimit, Reset, Unit
from sluice.policies.yaml_format import dump_policy, load_text

RULES = """\
domain: shop
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 2}
    descriptors:
      - key: plan
        rate_limit: {unit: hour, requests_per_unit: 9}
"""


def load(extra: str) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        load_text(RULES + textwrap.dedent(extra), "p.yaml")
    return raised.value.problems


def test_pins_and_resets_load_and_dump_canonically() -> None:
    [policy] = load_text(
        RULES
        + textwrap.dedent(
            """
            overrides:
              - descriptor: tenant=acme,plan=pro
                rate_limit: {unit: hour, requests_per_unit: 50, algorithm: gcra, burst: 5}
                expires_at: 2027-01-15T08:00:00Z
            blocks: [{descriptor: tenant=evil}]
            allows: [{descriptor: tenant=health, expires_at: "2027-01-15T09:00:00+01:00"}]
            resets: [{descriptor: tenant=bob, generation: 3}]
            """
        )
    )
    assert policy.pins == (
        Pin(
            "overrides",
            (("tenant", "acme"), ("plan", "pro")),
            RateLimit(50, Unit.HOUR, "", "gcra", 5),
            1_800_000_000.0,
        ),
        Pin("blocks", (("tenant", "evil"),)),
        Pin("allows", (("tenant", "health"),), None, 1_800_000_000.0),
    )
    assert policy.resets == (Reset((("tenant", "bob"),), 3),)
    text = dump_policy(policy)
    assert "expires_at: '2027-01-15T08:00:00Z'" in text
    assert load_text(text) == [policy]


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        (
            "blocks: [{descriptor: user=x}]",
            "p.yaml:8: blocks[0].descriptor: no rule of domain 'shop' limits user=x",
        ),
        (
            "blocks: [{descriptor: plan=x}]",
            "p.yaml:8: blocks[0].descriptor: no rule of domain 'shop' limits plan=x",
        ),
        (
            "allows: [{descriptor: tenant}]",
            "p.yaml:8: allows[0].descriptor: 'tenant' is not KEY=VALUE",
        ),
        (
            "allows: [{expires_at: 2030-01-01T00:00:00Z}]",
            "p.yaml:8: allows[0].descriptor: missing (KEY=VALUE,…)",
        ),
        ("allows: [tenant=x]", "p.yaml:8: allows[0] must be a mapping"),
        ("allows: {descriptor: tenant=x}", "p.yaml:8: 'allows' must be a list"),
        (
            "blocks: [{descriptor: tenant=x, expires_at: soon}]",
            "p.yaml:8: blocks[0].expires_at: 'soon' is not an ISO 8601 time",
        ),
        (
            "blocks: [{descriptor: tenant=x, rate_limit: {unit: hour}}]",
            "p.yaml:8: unknown key 'rate_limit' in blocks[0]",
        ),
        (
            "overrides: [{descriptor: tenant=x}]",
            "p.yaml:8: overrides[0].rate_limit: missing (unit, requests_per_unit, …)",
        ),
        (
            "overrides: [{descriptor: tenant=x,\n"
            "  rate_limit: {unit: fortnight, requests_per_unit: 1}}]",
            "p.yaml:9: invalid rate limit unit 'fortnight'",
        ),
        (
            "overrides: [{descriptor: tenant=x,\n"
            "  rate_limit: {unit: hour, requests_per_unit: 1, name: n}}]",
            "p.yaml:9: unknown key 'name' in overrides[0].rate_limit",
        ),
        (
            "blocks: [{descriptor: tenant=x}]\nallows: [{descriptor: tenant=x}]",
            "p.yaml:9: allows[0].descriptor: tenant=x is already in blocks[0]",
        ),
        (
            "resets: [{descriptor: tenant=x}]",
            "p.yaml:8: resets[0].generation: must be a whole number from 1",
        ),
        (
            "resets: [{descriptor: tenant=x, generation: 0}]",
            "p.yaml:8: resets[0].generation: must be a whole number from 1",
        ),
        (
            "resets: [{descriptor: tenant=x, generation: 1},\n"
            "  {descriptor: tenant=x, generation: 2}]",
            "p.yaml:9: resets[1].descriptor: tenant=x is reset twice",
        ),
    ],
)
def test_every_problem_names_its_line_and_field(extra: str, problem: str) -> None:
    [found] = load(extra)
    assert found.startswith(problem)
