"""Overrides, blocks, the allow-list and resets: the rows and countdowns (pins.py), the
page that lists and changes them (views/pins.py) and the Live usage page's "let this key in
again", each change made through PolicyService as ``sluice block`` makes it."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from sluice.clock import ManualClock
from sluice.model import Pin, RateLimit, Unit
from sluice.policies.service import PolicyService
from sluice.policies.store import PolicyStore
from sluice.usage.store import UsageStore
from sluice_admin import pins
from sluice_admin.auth import Role, User
from sluice_admin.data import AdminData, NotAllowedError
from tests.admin._harness import errors, new_app, no_exceptions, open_page, sign_in, texts

NOW = 1_800_000_000  # the pages' clock: countdowns and expiries count from it


def plain(shown: list[str]) -> list[str]:
    """Messages as read: the pages escape Markdown in user-written text."""
    return [m.replace("\\", "") for m in shown]


def successes(at: AppTest) -> list[str]:
    return plain([s.value for s in at.success])


# -- pins.py ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("left_s", "shown"),
    [
        (0.2, "1 s"),  # rounded up: never shown as expired before it is
        (59, "59 s"),
        (65, "1 m 05 s"),
        (3600 + 125, "1 h 02 m"),
        (3 * 86400 + 4 * 3600 + 5, "3 d 4 h"),
        (0, "expired"),
        (-30, "expired"),
    ],
)
def test_countdown(left_s: float, shown: str) -> None:
    assert pins.countdown(NOW + left_s, NOW) == shown


def test_rows_soonest_first_with_limits_and_expiry() -> None:
    limit = RateLimit(1000, Unit.SECOND, algorithm="token_bucket", burst=50)
    listed = [
        Pin("overrides", (("user", "forever"),), limit),
        Pin("overrides", (("user", "later"),), RateLimit(5, Unit.HOUR), NOW + 600.0),
        Pin("blocks", (("user", "eve"),), None, NOW + 10.0),
        Pin("overrides", (("user", "soon"),), RateLimit(5, Unit.HOUR), NOW - 1.0),
    ]
    assert [r.line for r in pins.rows(listed, "overrides", NOW)] == [
        "user=soon · 5 / hour (fixed_window) · expired at 2027-01-15T07:59:59Z "
        "(pruned at the next pin change)",
        "user=later · 5 / hour (fixed_window) · expires in 10 m 00 s (2027-01-15T08:10:00Z)",
        "user=forever · 1000 / second (token_bucket, burst 50) · no expiry",
    ]
    assert [r.line for r in pins.rows(listed, "blocks", NOW)] == [
        "user=eve · expires in 10 s (2027-01-15T08:00:10Z)"
    ]


@pytest.mark.parametrize(
    ("key", "descriptor"),
    [
        ("user,mallory", "user=mallory"),
        ("tenant,acme,path,/login", "tenant=acme,path=/login"),
        ("user,mallory,#reset:2", "user=mallory"),  # recorded after an earlier reset
        ("user,vip,#override#reset:1", "user=vip"),
        ("user,a,b", None),  # a value holding a comma: cannot be named again
    ],
)
def test_offender_descriptor(key: str, descriptor: str | None) -> None:
    assert pins.offender_descriptor(key) == descriptor


# -- the page ---------------------------------------------------------------------------------


def pins_page(name: str = "ed", clock: ManualClock | None = None) -> AppTest:
    return open_page(sign_in(new_app(clock or ManualClock(NOW)), name), "pins")


def fill(at: AppTest, kind: str, **values: object) -> AppTest:
    """Fill a kind's add form (widgets by key, ``pins_`` prefixed) and submit it."""
    for name, value in values.items():
        key = f"pins_{name}" if name in ("rpu", "unit", "alg", "burst") else f"pins_{kind}_{name}"
        for widgets in (at.text_input, at.number_input, at.selectbox):
            if any(w.key == key for w in widgets):
                widgets(key=key).set_value(value)
                break
        else:
            raise AssertionError(f"no form widget {key}")
    at.button(key=f"pins_{kind}_submit").click()
    return at.run()


def test_an_override_counts_down_to_its_expiry(database_url: str, service: PolicyService) -> None:
    clock = ManualClock(NOW)
    at = pins_page(clock=clock)
    empty = ["No overrides in shop.", "No blocks in shop.", "No allow-list entries in shop."]
    assert [c for c in plain([c.value for c in at.caption]) if c.startswith("No ")] == empty
    at = fill(
        at,
        "overrides",
        descriptor="user=vip",
        rpu=1000,
        unit="second",
        expires="10m",
    )
    no_exceptions(at)
    assert not errors(at)
    assert successes(at) == ["Override: user=vip (version 2 of shop)"]
    [pin] = service.get("shop").policy.pins
    assert (pin.kind, pin.entries, pin.expires_at_s) == ("overrides", (("user", "vip"),), NOW + 600)
    assert pin.rate_limit == RateLimit(1000, Unit.SECOND)
    live = service.get("shop")
    assert (live.author, live.comment) == ("ed", "override user=vip")
    line = "user=vip · 1000 / second (fixed_window) · expires in 10 m 00 s (2027-01-15T08:10:00Z)"
    assert line in texts(at)

    clock.advance(595)
    at.run()
    assert "user=vip · 1000 / second (fixed_window) · expires in 5 s (2027-01-15T08:10:00Z)" in (
        texts(at)
    )
    clock.advance(5)
    at.run()
    assert (
        "user=vip · 1000 / second (fixed_window) · expired at 2027-01-15T08:10:00Z "
        "(pruned at the next pin change)"
    ) in texts(at)


def test_block_then_unblock(database_url: str, service: PolicyService) -> None:
    at = fill(pins_page(), "blocks", descriptor=" user=mallory ", comment="scraping")
    assert successes(at) == ["Block: user=mallory (version 2 of shop)"]
    assert service.get("shop").comment == "scraping"
    assert "user=mallory · no expiry" in texts(at)
    at.button(key="pins_remove_blocks_user=mallory").click().run()
    no_exceptions(at)
    assert successes(at) == ["Unblock: user=mallory (version 3 of shop)"]
    live = service.get("shop")
    assert (live.version, live.policy.pins, live.comment) == (3, (), "unblock")
    assert "user=mallory · no expiry" not in texts(at)


def test_the_servers_reasons_are_shown_and_nothing_is_written(
    database_url: str, service: PolicyService
) -> None:
    at = fill(pins_page(), "allows", descriptor="path=/x")
    assert plain(errors(at)) == ["descriptor: no rule of domain 'shop' limits path=/x"]
    at = fill(at, "allows", descriptor="user=bob", expires="soon")
    assert plain(errors(at)) == [
        "expires_in: 'soon' is neither a duration (30s, 10m, 2h, 7d, 1w) nor an ISO 8601 time"
    ]
    assert service.get("shop").version == 1


def test_reset_a_key(database_url: str, service: PolicyService) -> None:
    at = pins_page()
    at.text_input(key="pins_reset_key").input("user=bob")
    at.button(key="pins_reset_submit").click().run()
    no_exceptions(at)
    assert successes(at) == [
        "Counters of user=bob start afresh on every server (version 2 of shop)"
    ]
    [reset] = service.get("shop").policy.resets
    assert (reset.entries, reset.generation) == ((("user", "bob"),), 1)


def test_a_viewer_sees_the_lists_but_cannot_change_them(
    database_url: str, service: PolicyService
) -> None:
    service.put_pin("shop", "blocks", "user=eve", author="ops", comment="")
    at = pins_page("vi")
    no_exceptions(at)
    assert "user=eve · no expiry" in texts(at)
    assert not [b for b in at.button if (b.key or "").startswith("pins_")]
    assert not at.text_input
    data = AdminData.open(database_url)
    viewer = User("vi", Role.VIEWER)
    with pytest.raises(NotAllowedError, match="vi is a viewer: only editors may change blocks"):
        data.put_pin(viewer, "shop", "blocks", "user=bob", comment="", clock=ManualClock(NOW))
    with pytest.raises(NotAllowedError):
        data.delete_pin(viewer, "shop", "blocks", "user=eve", comment="")
    with pytest.raises(NotAllowedError):
        data.reset(viewer, "shop", "user=eve", comment="")
    data.close()
    assert service.get("shop").version == 2


# -- "let this key in again" on the Live usage page ------------------------------------------


def seed_offenders(store: PolicyStore) -> None:
    second = NOW - 3
    UsageStore(store.database).add(
        {("shop.user", second): [30, 10, 0, 0, 0, 0]},
        {("shop.user", second - second % 60): {"user,mallory,#reset:1": 9, "user,eve": 1}},
    )


def test_let_an_offender_in_again_from_live_usage(
    database_url: str, store: PolicyStore, service: PolicyService
) -> None:
    seed_offenders(store)
    at = open_page(sign_in(new_app(ManualClock(NOW)), "ed"), "live")
    [offenders] = at.dataframe
    # Refused after an earlier reset, the key still shows as its value alone.
    assert offenders.value["key"].tolist() == ["mallory", "eve"]
    at.button(key="live_reset_shop.user_user,mallory,#reset:1").click().run()
    no_exceptions(at)
    assert successes(at) == ["user=mallory starts afresh on every server (version 2 of shop)."]
    live = service.get("shop")
    assert (live.author, live.comment) == ("ed", "let user=mallory in again")
    assert [(r.entries, r.generation) for r in live.policy.resets] == [((("user", "mallory"),), 1)]


def test_a_viewer_gets_no_reset_buttons_on_live_usage(
    database_url: str, store: PolicyStore
) -> None:
    seed_offenders(store)
    at = open_page(sign_in(new_app(ManualClock(NOW)), "vi"), "live")
    assert len(at.dataframe) == 1
    assert not [b for b in at.button if (b.key or "").startswith("live_reset_")]


def test_no_reset_buttons_for_what_rlqs_data_planes_decided(
    database_url: str, store: PolicyStore
) -> None:
    second = NOW - 3
    UsageStore(store.database).add(
        {("shop.user (rlqs)", second): [50, 5, 0, 0, 0, 0]},
        {("shop.user (rlqs)", second - second % 60): {"user,mallory": 5}},
    )
    at = open_page(sign_in(new_app(ManualClock(NOW)), "ed"), "live")
    assert len(at.dataframe) == 1
    assert not [b for b in at.button if (b.key or "").startswith("live_reset_")]
