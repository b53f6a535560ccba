"""Editing the descriptor tree as rule mappings (pending.py)."""

from __future__ import annotations

import yaml

from sluice.policies.service import PolicyService
from sluice.policies.store import PolicyStore
from sluice.policies.yaml_format import load_text
from sluice_admin import pending
from sluice_admin.data import AdminData
from sluice_admin.pending import LimitFields, RuleForm, form_from_rule

[NESTED] = load_text(
    """\
domain: msg
descriptors:
  - key: type
    value: marketing
    descriptors:
      - key: to
        rate_limit: {unit: day, requests_per_unit: 5, name: per_to}
"""
)


def test_rows_paths_and_usage_ids() -> None:
    rows = pending.rows(NESTED)
    # One name per rule on every page: the usage id, /metrics' ``rule`` label.
    assert [r.label for r in rows] == ["msg.type_marketing", "msg.type_marketing.to"]
    assert pending.rule_id("msg", rows[1].path) == "msg.type_marketing.to"


def test_put_edits_in_place_keeping_children_and_adds_at_the_end() -> None:
    docs = pending.document_rules(NESTED)
    path = (("type", "marketing"),)
    edited = pending.put_rule(docs, (), path, {"key": "type", "value": "promo"})
    assert edited[0]["value"] == "promo" and edited[0]["descriptors"] == docs[0]["descriptors"]
    added = pending.put_rule(docs, path, None, {"key": "from"})
    assert [d["key"] for d in added[0]["descriptors"]] == ["to", "from"]
    assert docs == pending.document_rules(NESTED)  # never mutated


def test_remove_drops_the_rule_and_an_emptied_children_list() -> None:
    docs = pending.document_rules(NESTED)
    assert pending.remove_rule(docs, (("type", "marketing"), ("to", None))) == [
        {"key": "type", "value": "marketing"}
    ]


def test_form_round_trips_a_rule() -> None:
    rule = NESTED.descriptors[0].descriptors[0]
    form = pending.form_from_rule(rule)
    assert form.name == "per_to" and form.limits == [LimitFields(5, "day", "fixed_window", None)]
    assert form.document() == {
        "key": "to",
        "rate_limit": {"name": "per_to", "unit": "day", "requests_per_unit": 5},
    }
    two = RuleForm(key="k", limits=[LimitFields(1, "second"), LimitFields(10, "minute", "gcra", 3)])
    assert two.document()["rate_limit"]["limits"][1] == {
        "unit": "minute",
        "requests_per_unit": 10,
        "algorithm": "gcra",
        "burst": 3,
    }


def test_diff_against_nothing_and_no_change() -> None:
    assert pending.diff(NESTED, 4, NESTED) == ""
    assert pending.diff(None, 0, NESTED).startswith("--- /dev/null\n+++ msg (pending)\n")


def test_an_edit_keeps_what_the_form_does_not_show() -> None:
    # Calendar windows, quota mode, metric naming and metadata are not on the form: editing
    # the rule's limit must write them back unchanged, not drop them.
    text = """domain: d
descriptors:
  - key: tenant
    rate_limit: {unit: month, requests_per_unit: 100, calendar: true, timezone: Europe/Paris}
    quota_mode: true
    value_to_metric: true
    detailed_metric: true
    metadata: {team: edge}
"""
    [policy] = load_text(text, "d.yaml")
    form = form_from_rule(policy.descriptors[0])
    form.limits[0].requests_per_unit = 200
    document = {"domain": "d", "descriptors": [form.document()]}
    [edited] = load_text(yaml.safe_dump(document), "e.yaml")
    before, after = policy.descriptors[0], edited.descriptors[0]
    assert after.limits[0].requests_per_unit == 200
    assert after.limits[0].timezone == before.limits[0].timezone == "Europe/Paris"
    assert (after.quota_mode, after.value_to_metric, after.detailed_metric) == (True, True, True)
    assert after.metadata == before.metadata


def test_a_rules_edit_keeps_the_domains_settings_and_pins(database_url: str) -> None:
    # The editor changes rules only: the domain's limit_overrides and its operators' pins
    # must survive a publish, and the diff must not show them going.
    text = """domain: shop
limit_overrides: deny
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
blocks:
  - descriptor: user=mallory
"""
    data = AdminData.open(database_url)
    try:
        with PolicyStore(database_url) as store:
            PolicyService(store).publish(load_text(text), author="seed", comment="pinned")
        live = data.get("shop")
        assert live is not None
        rules = [{"key": "user", "rate_limit": {"unit": "minute", "requests_per_unit": 7}}]
        edited = data.validate_descriptors("shop", rules)
        assert edited.limit_overrides == "deny"
        assert edited.pins == live.policy.pins and len(edited.pins) == 1
        changes = [
            line
            for line in pending.diff(live.policy, live.version, edited).splitlines()
            if line[:1] in "+-" and line[:3] not in ("+++", "---")
        ]
        assert changes == ["-    requests_per_unit: 5", "+    requests_per_unit: 7"]
    finally:
        data.close()
