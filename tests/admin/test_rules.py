"""The Rules page: a pending change built with forms, validated by the server's loader,
diffed against the live version and published through PolicyService."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from sluice.policies.service import PolicyService
from sluice.policies.yaml_format import load_text
from tests.admin._harness import codes, errors, new_app, no_exceptions, open_page, sign_in, texts


def rules_page(name: str = "ed") -> AppTest:
    return open_page(sign_in(new_app(), name), "rules")


def submit_form(at: AppTest, **values: object) -> AppTest:
    """Fill the rule form's widgets (by key, without the ``rf_`` prefix) and submit it."""
    for name, value in values.items():
        key = f"rf_{name}"
        for widgets in (at.text_input, at.number_input, at.selectbox, at.checkbox, at.radio):
            if any(w.key == key for w in widgets):
                widgets(key=key).set_value(value)
                break
        else:
            raise AssertionError(f"no form widget {key}")
    at.button(key="rf_submit").click()
    return at.run()


def test_the_tree_shows_the_live_rules_as_text(database_url: str) -> None:
    at = rules_page()
    no_exceptions(at)
    assert "shop.user: 5 / minute" in texts(at)
    assert "Domain shop: live version 1" in [c.value for c in at.caption]


def test_add_a_rule_then_publish_it_with_a_comment(
    database_url: str, service: PolicyService
) -> None:
    at = rules_page()
    at.button(key="rules_add").click().run()
    at = submit_form(at, key="ip", rpu=3, unit="hour", alg="gcra", burst=2)
    no_exceptions(at)
    assert not errors(at)
    assert "shop.ip: 3 / hour (gcra, burst 2)" in texts(at)

    [diff] = codes(at)[-1:]
    assert "+- key: ip" in diff.splitlines()
    assert "+    algorithm: gcra" in diff.splitlines()
    assert service.get("shop").version == 1  # nothing published yet

    at.text_input(key="rules_comment").input("per-ip limit")
    at.button(key="rules_publish").click().run()
    no_exceptions(at)
    assert [s.value for s in at.success] == ["Published version 2 of shop."]
    live = service.get("shop")
    assert (live.version, live.author, live.comment) == (2, "ed", "per-ip limit")
    assert [r.key for r in live.policy.descriptors] == ["user", "ip"]
    assert live.policy.descriptors[1].limits[0].burst == 2


def test_edit_a_rule_prefills_the_form_and_diffs_the_change(database_url: str) -> None:
    at = rules_page()
    at.button(key="rules_edit_0").click().run()
    assert at.text_input(key="rf_key").value == "user"
    assert at.number_input(key="rf_rpu").value == 5
    at = submit_form(at, rpu=7)
    assert "shop.user: 7 / minute" in texts(at)
    diff = codes(at)[-1].splitlines()
    assert "-    requests_per_unit: 5" in diff
    assert "+    requests_per_unit: 7" in diff


def test_a_validation_error_is_the_loaders_own_message(database_url: str) -> None:
    at = rules_page()
    at.button(key="rules_dup_0").click().run()  # a key-only rule: the copy collides
    at = submit_form(at)
    assert errors(at) == ["The server's policy loader refused this change:"]
    # Verbatim from the loader; line 7 of the YAML it checked is the second '- key: user'.
    assert "pending:7: duplicate descriptor composite key 'shop.user'" in codes(at)
    assert texts(at).count("shop.user: 5 / minute") == 1  # the pending change was left alone


def test_replaces_naming_no_limit_is_accepted_as_upstream_accepts_it(database_url: str) -> None:
    # envoyproxy/ratelimit serves it (nothing is replaced); `sluice check --strict` warns.
    at = rules_page()
    at.button(key="rules_add").click().run()
    at = submit_form(at, key="ip", replaces="nosuch")
    assert errors(at) == []
    assert not [c for c in codes(at) if c.startswith("pending:")]
    assert any("- name: nosuch" in c for c in codes(at))


def test_delete_a_rule_leaves_an_empty_pending_tree(database_url: str) -> None:
    at = rules_page()
    at.button(key="rules_delete_0").click().run()
    assert "shop.user: 5 / minute" not in texts(at)
    assert "This domain has no rules yet. Add one below." in [i.value for i in at.info]
    assert "-- key: user" in codes(at)[-1].splitlines()


def test_a_stale_publish_shows_the_stale_version_message(
    database_url: str, service: PolicyService
) -> None:
    at = rules_page()
    at.button(key="rules_edit_0").click().run()
    at = submit_form(at, rpu=9)
    # Someone else publishes in between.
    [other] = load_text("domain: shop\ndescriptors:\n  - key: other\n")
    service.publish([other], author="someone", comment="meanwhile")
    at.button(key="rules_publish").click().run()
    assert "domain 'shop' is at version 2, not the expected 1; reload it and try again" in [
        e.value.replace("\\", "") for e in at.error
    ]
    assert service.get("shop").version == 2
    at.button(key="rules_reload").click().run()
    assert "shop.other: whitelisted (no limit)" in texts(at)


def test_a_concurrency_rule_reads_as_leases_at_once(
    database_url: str, service: PolicyService
) -> None:
    text = "domain: shop\ndescriptors:\n  - key: jobs\n    rate_limit: {concurrency: 20}\n"
    service.publish(load_text(text), author="someone", comment="leases")
    at = rules_page()
    assert "shop.jobs: 20 at once (leases of 30s)" in texts(at)


def test_yaml_view_shows_the_pending_document(database_url: str) -> None:
    at = rules_page()
    assert any(c.startswith("domain: shop\ndescriptors:\n- key: user") for c in codes(at))


def test_a_viewer_sees_rules_but_no_editing(database_url: str) -> None:
    at = rules_page("vi")
    assert "shop.user: 5 / minute" in texts(at)
    keys = {b.key for b in at.button}
    assert not keys & {"rules_edit_0", "rules_dup_0", "rules_delete_0", "rules_add"}
    assert "You are a viewer: rules can be looked at, not changed." in [c.value for c in at.caption]


def test_a_new_domain_is_published_with_base_version_zero(
    database_url: str, service: PolicyService
) -> None:
    at = rules_page()
    at.text_input(key="rules_new_domain").input("edge").run()
    at.button(key="rules_create_domain").click().run()
    at.button(key="rules_add").click().run()
    at = submit_form(at, key="remote_address", rpu=100, unit="second")
    at.button(key="rules_publish").click().run()
    no_exceptions(at)
    assert service.get("edge").version == 1


def test_edit_as_yaml_follows_form_edits_and_publishes(
    database_url: str, service: PolicyService
) -> None:
    at = rules_page()
    at.button(key="rules_edit_0").click().run()
    at = submit_form(at, rpu=7)
    [area] = at.text_area
    assert "    requests_per_unit: 7" in area.value.splitlines()  # not the text of the visit
    # Applying it unchanged keeps the form's edit (it used to put 5 back, silently).
    at.button(key="rules_yaml_apply").click().run()
    assert "shop.user: 7 / minute" in texts(at)

    at.button(key="rules_publish").click().run()
    assert service.get("shop").policy.descriptors[0].limits[0].requests_per_unit == 7
    [area] = at.text_area
    assert "    requests_per_unit: 7" in area.value.splitlines()
    at.button(key="rules_yaml_apply").click().run()
    assert "shop.user: 7 / minute" in texts(at)
    assert at.caption[0].value == "Domain shop: live version 2"  # nothing pending


def refused_publish(at: AppTest, service: PolicyService, rpu: int) -> AppTest:
    """Edit the rule, let someone else publish first, then publish: refused as stale."""
    at.button(key="rules_edit_0").click().run()
    at = submit_form(at, rpu=rpu)
    live = service.get("shop")
    [other] = load_text(
        f"domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {{unit: minute, "
        f"requests_per_unit: {100 + live.version}}}\n"
    )
    service.publish([other], author="someone", comment="meanwhile")
    at.button(key="rules_publish").click().run()
    stale = (
        f"domain 'shop' is at version {live.version + 1}, not the expected {live.version}; "
        "reload it and try again"
    )
    assert [e.value.replace("\\", "") for e in at.error] == [stale]
    return at


def test_the_stale_version_error_clears_on_discard_new_edit_and_publish(
    database_url: str, service: PolicyService
) -> None:
    at = refused_publish(rules_page(), service, 9)
    at.button(key="rules_discard").click().run()
    assert not errors(at)

    at = refused_publish(at, service, 8)
    at.button(key="rules_edit_0").click().run()
    at = submit_form(at, rpu=6)  # a new edit: the message was about the one before
    assert not errors(at)

    at.button(key="rules_discard").click().run()
    at = refused_publish(at, service, 4)
    at.button(key="rules_reload").click().run()
    at.button(key="rules_edit_0").click().run()
    at = submit_form(at, rpu=3)
    at.button(key="rules_publish").click().run()
    assert not errors(at)
    assert service.get("shop").policy.descriptors[0].limits[0].requests_per_unit == 3


def test_the_stale_version_error_belongs_to_its_domain(
    database_url: str, service: PolicyService
) -> None:
    service.publish(load_text("domain: edge\ndescriptors:\n  - key: ip\n"), author="x", comment="")
    at = rules_page()
    at.sidebar.selectbox[0].set_value("shop").run()
    at = refused_publish(at, service, 9)
    at.sidebar.selectbox[0].set_value("edge").run()
    assert [c.value for c in at.caption][0] == "Domain edge: live version 1"
    assert not errors(at)  # shop's refused publish says nothing about edge


def test_the_form_shows_a_second_limit_only_when_the_rule_has_one(
    database_url: str, service: PolicyService
) -> None:
    at = rules_page()
    at.button(key="rules_edit_0").click().run()
    assert "rf_rpu2" not in {w.key for w in at.number_input}
    at.checkbox(key="rf_two").check().run()
    assert at.number_input(key="rf_rpu2").value == 10  # the default of a new limit
    at = submit_form(at, rpu2=100, unit2="hour")
    assert "shop.user: 5 / minute and 100 / hour" in texts(at)

    at.button(key="rules_edit_0").click().run()
    assert (at.checkbox(key="rf_two").value, at.number_input(key="rf_rpu2").value) == (True, 100)
    # Unlimited has no limit fields at all; back to limited, the values are still there.
    at.radio(key="rf_mode").set_value("unlimited").run()
    assert not {w.key for w in at.number_input} & {"rf_rpu", "rf_rpu2"}
    assert not any(c.key == "rf_two" for c in at.checkbox)
    at.radio(key="rf_mode").set_value("limit").run()
    assert (at.number_input(key="rf_rpu").value, at.number_input(key="rf_rpu2").value) == (5, 100)


def test_a_limit_of_zero_reads_blocked(database_url: str, service: PolicyService) -> None:
    [policy] = load_text(
        "domain: shop\ndescriptors:\n  - key: user\n    value: mallory\n"
        "    rate_limit: {unit: second, requests_per_unit: 0}\n"
    )
    service.publish([policy], author="x", comment="block mallory")
    assert "shop.user_mallory: blocked" in texts(rules_page())
