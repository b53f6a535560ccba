"""History with one-click rollback (after a confirmation) and YAML import/export."""

from __future__ import annotations

from sluice.policies.service import PolicyService
from sluice.policies.yaml_format import load_text
from sluice_admin.views.transfer import MAX_UPLOAD_BYTES
from tests.admin._harness import codes, errors, new_app, no_exceptions, open_page, sign_in, texts

BAD = b"domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {unit: eon}\n"
GOOD = (
    b"domain: edge\ndescriptors:\n  - key: remote_address\n"
    b"    rate_limit: {unit: second, requests_per_unit: 50}\n"
)


def raise_limit(service: PolicyService) -> None:
    [policy] = load_text(
        "domain: shop\ndescriptors:\n  - key: user\n"
        "    rate_limit: {unit: minute, requests_per_unit: 50}\n"
    )
    service.publish([policy], author="carol", comment="raise")


def test_history_lists_versions_with_author_comment_and_diff(
    database_url: str, service: PolicyService
) -> None:
    raise_limit(service)
    at = open_page(sign_in(new_app(), "ed"), "history")
    no_exceptions(at)
    shown = texts(at)
    assert any(t.startswith("v2 · ") and t.endswith(" · carol · live") for t in shown)
    assert "Comment: raise" in shown
    assert any("+    requests_per_unit: 50" in c.splitlines() for c in codes(at))


def test_rollback_asks_first_then_restores(database_url: str, service: PolicyService) -> None:
    raise_limit(service)
    at = open_page(sign_in(new_app(), "ed"), "history")
    assert not any(b.key == "history_rollback_2" for b in at.button)  # the live one
    at.button(key="history_rollback_1").click().run()
    [warning] = [w.value for w in at.warning]
    assert "to version 1?" in warning
    assert service.get("shop").version == 2  # nothing happened yet

    at.button(key="history_cancel").click().run()
    assert not at.warning
    at.button(key="history_rollback_1").click().run()
    # What the rollback changes, from the live version to the restored one.
    assert any(
        "-    requests_per_unit: 50" in c.splitlines() and "+    requests_per_unit: 5" in c
        for c in codes(at)
    )
    assert at.text_input(key="history_comment_1").value == "roll back to v1"
    at.text_input(key="history_comment_1").input("50 was too many")
    at.button(key="history_confirm_yes").click().run()
    no_exceptions(at)
    assert [s.value for s in at.success] == ["Version 3 restores version 1."]
    live = service.get("shop")
    assert (live.version, live.author, live.comment) == (3, "ed", "50 was too many")
    assert live.policy.descriptors[0].limits[0].requests_per_unit == 5
    assert service.history("shop")[0].restored_from == 1


def test_a_viewer_gets_no_rollback_buttons(database_url: str, service: PolicyService) -> None:
    raise_limit(service)
    at = open_page(sign_in(new_app(), "vi"), "history")
    assert not [b for b in at.button if (b.key or "").startswith("history_")]


def test_import_shows_the_loaders_errors_by_line(database_url: str) -> None:
    at = open_page(sign_in(new_app(), "ed"), "transfer")
    at.file_uploader(key="transfer_file").upload("limits.yaml", BAD, "application/yaml").run()
    no_exceptions(at)
    assert errors(at) == ["The file has 1 problem(s); nothing was imported:"]
    assert codes(at)[-1].splitlines() == ["limits.yaml:4: invalid rate limit unit 'eon'"]
    assert not any(b.key == "transfer_import" for b in at.button)


def test_import_refuses_malformed_json_naming_the_line(database_url: str) -> None:
    broken = b'{"domain": "shop",\n "descriptors": [\n  {"key": "user",, "value": "x"}\n]}\n'
    at = open_page(sign_in(new_app(), "ed"), "transfer")
    at.file_uploader(key="transfer_file").upload("limits.json", broken, "application/json").run()
    no_exceptions(at)
    assert errors(at) == ["The file has 1 problem(s); nothing was imported:"]
    [problem] = codes(at)[-1].splitlines()
    assert problem.startswith("limits.json:3: ")
    assert not any(b.key == "transfer_import" for b in at.button)


def test_import_refuses_an_oversized_or_binary_file(database_url: str) -> None:
    at = open_page(sign_in(new_app(), "ed"), "transfer")
    huge = GOOD + b"# padding\n" * (MAX_UPLOAD_BYTES // 10)
    at.file_uploader(key="transfer_file").upload("huge.yaml", huge, "application/yaml").run()
    assert errors(at) == ["The file is larger than 1024 KiB; nothing was imported."]
    at.file_uploader(key="transfer_file").upload("bin.yaml", b"\xff\xfe\x00", "application/yaml")
    at.run()
    assert errors(at) == ["The file is not UTF-8 text."]
    no_exceptions(at)


def test_import_publishes_a_valid_file(database_url: str, service: PolicyService) -> None:
    at = open_page(sign_in(new_app(), "ed"), "transfer")
    at.file_uploader(key="transfer_file").upload("edge.yaml", GOOD, "application/yaml").run()
    assert "Valid: edge (1 rules)" in texts(at)
    at.button(key="transfer_import").click().run()
    no_exceptions(at)
    assert [s.value for s in at.success] == ["Imported: edge → v1."]
    assert service.get("edge").comment == "import edge.yaml"


def test_import_counts_rules_as_the_rules_page_lists_them(database_url: str) -> None:
    nested = (
        b"domain: msg\ndescriptors:\n  - key: type\n    value: marketing\n    descriptors:\n"
        b"      - key: to\n        rate_limit: {unit: day, requests_per_unit: 2}\n"
        b"  - key: to\n    rate_limit: {unit: hour, requests_per_unit: 20}\n"
    )
    at = open_page(sign_in(new_app(), "ed"), "transfer")
    at.file_uploader(key="transfer_file").upload("msg.yaml", nested, "application/yaml").run()
    # msg.type_marketing, msg.type_marketing.to and msg.to: three rows on the Rules page
    assert "Valid: msg (3 rules)" in texts(at)


def test_export_offers_the_current_yaml(database_url: str) -> None:
    at = open_page(sign_in(new_app(), "vi"), "transfer")
    assert at.download_button(key="transfer_download") is not None
    assert codes(at)[0].splitlines() == [
        "domain: shop",
        "descriptors:",
        "- key: user",
        "  rate_limit:",
        "    unit: minute",
        "    requests_per_unit: 5",
    ]
