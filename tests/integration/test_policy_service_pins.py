"""PolicyService's per-descriptor changes on a real config database, on a manual clock:
each is a version with author and comment, validated before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.clock import ManualClock
from sluice.errors import ConfigError, DomainNotFoundError
from sluice.model import Reset
from sluice.policies.service import PolicyService
from sluice.policies.store import PolicyStore

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
RULES = """domain: shop
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 2}
"""


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def service(tmp_path: Path, clock: ManualClock) -> PolicyService:
    store = PolicyStore(f"sqlite:///{tmp_path / 'config.db'}")
    store.upgrade()
    service = PolicyService(store, clock=clock)
    service.publish_document(RULES, author="ops", comment="seed")
    return service


def test_a_pin_is_a_version_with_its_author_comment_and_diff(service: PolicyService) -> None:
    changed = service.put_pin(
        "shop",
        "overrides",
        "tenant=acme",
        rate_limit={"unit": "hour", "requests_per_unit": 10},
        expires_in="7d",
        author="alice",
        comment="until Friday",
    )
    assert changed == {"shop": 2}
    latest = service.history("shop")[0]
    assert (latest.author, latest.comment) == ("alice", "until Friday")
    assert "+- descriptor: tenant=acme\n" in latest.diff
    assert "+  expires_at: '2027-01-22T08:00:00Z'\n" in latest.diff
    [pin] = service.pins("shop", "overrides")
    assert pin.expires_at_s == T0 + 7 * 86400


def test_setting_again_replaces_and_expired_pins_are_pruned(
    service: PolicyService, clock: ManualClock
) -> None:
    service.put_pin("shop", "blocks", "tenant=a", expires_in="10s", author="o", comment="")
    service.put_pin("shop", "blocks", "tenant=b", author="o", comment="")
    service.put_pin("shop", "blocks", "tenant=b", expires_in="1h", author="o", comment="")
    assert [p.expires_at_s for p in service.pins("shop", "blocks")] == [T0 + 10, T0 + 3600]
    clock.advance(10)
    service.put_pin("shop", "allows", "tenant=c", author="o", comment="")
    assert [p.entries for p in service.pins("shop", "blocks")] == [(("tenant", "b"),)]


def test_a_descriptor_is_pinned_one_way_only(service: PolicyService) -> None:
    service.put_pin("shop", "blocks", "tenant=a", author="o", comment="")
    with pytest.raises(ConfigError) as raised:
        service.put_pin("shop", "allows", "tenant=a", author="o", comment="")
    assert raised.value.problems == ["descriptor: tenant=a is in blocks; remove it there first"]
    with pytest.raises(ConfigError) as raised:
        service.put_pin("shop", "blocks", "tenant=z", rate_limit={}, author="o", comment="")
    assert raised.value.problems == ["rate_limit: only overrides have one, not blocks"]
    with pytest.raises(ConfigError) as raised:
        service.put_pin("shop", "overrides", "tenant=z", author="o", comment="")
    assert raised.value.problems == [
        "rate_limit: an override needs one (requests_per_unit, unit, …)"
    ]
    with pytest.raises(ConfigError) as raised:
        service.put_pin("shop", "pins", "tenant=z", author="o", comment="")
    assert raised.value.problems == ["kind: must be one of overrides, blocks, allows, not 'pins'"]
    with pytest.raises(DomainNotFoundError):
        service.reset("nope", "tenant=a", author="o", comment="")
    assert len(service.history("shop")) == 2  # the seed and the one block: nothing else


def test_each_reset_is_a_new_generation_and_rollback_restores_the_old(
    service: PolicyService,
) -> None:
    service.reset("shop", "tenant=bob", author="o", comment="limited by mistake")
    service.reset("shop", "tenant=bob", author="o", comment="again")
    assert service.get("shop").policy.resets == (Reset((("tenant", "bob"),), 2),)
    assert service.rollback("shop", 2, author="o") == 4
    assert service.get("shop").policy.resets == (Reset((("tenant", "bob"),), 1),)


def test_editing_rules_keeps_the_pins(service: PolicyService) -> None:
    service.put_pin("shop", "blocks", "tenant=a", author="o", comment="")
    rule = service.validate_rule(
        "shop", {"key": "plan", "rate_limit": {"unit": "hour", "requests_per_unit": 1}}
    )
    service.put_rule("shop", (("plan", None),), rule, author="o", comment="")
    assert [p.entries for p in service.pins("shop", "blocks")] == [(("tenant", "a"),)]


def test_a_document_without_pins_keeps_the_live_ones_and_one_with_them_replaces_them(
    service: PolicyService,
) -> None:
    service.put_pin("shop", "blocks", "tenant=a", author="o", comment="")
    service.reset("shop", "tenant=b", author="o", comment="")
    # Rules kept as code, imported again by CI: the operator's block and reset stay.
    raised = RULES.replace("requests_per_unit: 2", "requests_per_unit: 3")
    assert service.publish_document(raised, author="ci", comment="") == {"shop": 4}
    live = service.get("shop").policy
    assert [p.entries for p in live.pins] == [(("tenant", "a"),)]
    assert live.resets == (Reset((("tenant", "b"),), 1),)
    # A document that names any of the lists is the whole truth: `blocks: []` clears.
    service.publish_document(raised + "blocks: []\n", author="ci", comment="")
    live = service.get("shop").policy
    assert (live.pins, live.resets) == ((), ())


def test_a_rule_a_live_pin_needs_cannot_go_without_the_pin(service: PolicyService) -> None:
    service.put_pin("shop", "blocks", "tenant=a", author="o", comment="")
    with pytest.raises(ConfigError) as raised:
        service.publish_document(RULES.replace("key: tenant", "key: user"), author="ci", comment="")
    assert raised.value.problems == [
        "shop:8: blocks[0].descriptor: no rule of domain 'shop' limits tenant=a"
    ]
    assert len(service.history("shop")) == 2
