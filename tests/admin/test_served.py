"""served.py's rule for where a sign-in may send the browser next: a path of the app only."""

from __future__ import annotations

import pytest

from sluice_admin.served import local_path


@pytest.mark.parametrize("target", ["/", "/rules", "/what_if", "/history?x=1"])
def test_a_path_of_the_app_is_kept(target: str) -> None:
    assert local_path(target) == target


@pytest.mark.parametrize(
    "target",
    [
        None,
        "",
        "rules",
        "https://evil.example/",
        "//evil.example/",
        "/\\evil.example",
        "/\t/evil.example",
        "/\n/evil.example",
        "javascript:alert(1)",
    ],
)
def test_anything_else_goes_to_the_start_page(target: str | None) -> None:
    assert local_path(target) == "/"
