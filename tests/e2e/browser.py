"""The admin app in Debian's chromium: starting ``sluice admin`` and driving pages."""

from __future__ import annotations

import contextlib
import os
import ssl
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice_admin.auth import hash_password
from tests.support.processes import free_port, wait_until

__all__ = [
    "CHROMIUM",
    "CHROMIUM_ARGS",
    "PASSWORD",
    "Outbound",
    "run_admin",
    "settle",
    "sign_in",
    "submit_sign_in",
]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PASSWORD = "browser test pw"


def _healthy(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(
            url + "/_stcore/health", timeout=0.5, context=context
        ) as response:
            return response.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def run_admin(
    workdir: Path,
    database_url: str,
    extra_args: Sequence[str] = (),
    https: ssl.SSLContext | None = None,
) -> Iterator[str]:
    """``sluice admin`` on a free port, with editor ``ed``; its URL once Streamlit answers
    (over HTTPS, checked with the ``https`` client context, when given)."""
    port = free_port()
    log = open(workdir / "admin.log", "w")  # noqa: SIM115 (closed below)
    env = {**os.environ, "SLUICE_ADMIN_USERS": f"ed:editor:{hash_password(PASSWORD)}"}
    process = subprocess.Popen(
        [sys.executable, "-m", "sluice", "admin", "--port", str(port), "--address", "127.0.0.1"]
        + ["--database-url", database_url, *extra_args],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=workdir,
        env=env,
    )
    url = f"{'https' if https else 'http'}://127.0.0.1:{port}"
    try:
        wait_until(lambda: process.poll() is not None or _healthy(url, https), 30, "sluice admin")
        assert process.poll() is None, (workdir / "admin.log").read_text()
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


@dataclass
class Outbound:
    """A browser context's route handler (``context.route("**/*", outbound.route)``): requests
    for any host but the admin app at ``url`` are refused before they leave, and listed."""

    url: str
    refused: list[str] = field(default_factory=list)

    def route(self, route: Any) -> None:
        host = urllib.parse.urlsplit(self.url).netloc
        if urllib.parse.urlsplit(route.request.url).netloc == host:
            route.continue_()
        else:
            self.refused.append(route.request.url)
            route.abort()


def settle(page: Any) -> None:
    """Wait until Streamlit is idle: it reruns the script after every input, and a click
    during a rerun lands on elements being replaced."""
    page.locator('[data-testid="stApp"][data-test-script-state="notRunning"]').wait_for()


def sign_in(page: Any, url: str, name: str = "ed", password: str = PASSWORD) -> None:
    page.goto(url)
    submit_sign_in(page, name, password)
    page.get_by_role("heading", name="Overview").wait_for()


def submit_sign_in(page: Any, name: str = "ed", password: str = PASSWORD) -> None:
    """Fill in and submit the sign-in form, and wait for the navigation that follows (to
    ``/_sluice/session``, which sets the session cookie and sends the browser on): a click
    during it would land on a page being left."""
    page.get_by_label("User name").fill(name)
    page.get_by_role("textbox", name="Password").fill(password)
    with page.expect_navigation(url=lambda url: "/_sluice/" not in url):
        page.get_by_role("button", name="Sign in").click()
