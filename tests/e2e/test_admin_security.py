"""The admin app's defences, in a real browser:

- no page is reachable without signing in, not even by its URL;
- rule names and descriptor values (user-written, and echoed back from live traffic) are
  shown as text, never run as HTML, script or a link, on any page;
- the Import page refuses an oversized file and publishes nothing;
- another site can neither open the app's WebSocket nor upload a file in a signed-in
  user's name (cross-site WebSocket hijacking, cross-site request forgery);
- Streamlit's /_stcore/metrics is closed; what the sign-in page needs answers.
"""

from __future__ import annotations

import base64
import os
import socket
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml
from playwright import sync_api as playwright

from sluice._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from sluice.policies.service import PolicyService
from sluice.policies.store import PolicyStore
from sluice.policies.yaml_format import load_text
from tests.e2e.browser import CHROMIUM, CHROMIUM_ARGS, run_admin, settle, sign_in
from tests.support.certs import make_pki
from tests.support.processes import sluice_serve, wait_until

pytestmark = pytest.mark.e2e

PAGES = (
    "overview",
    "rules",
    "live",
    "what_if",
    "pins",
    "history",
    "transfer",
    "leases",
    "rlqs",
    "users",
)
VALUE = "<script>window.__xss='value'</script>"
NAME = "<img src=x onerror=\"window.__xss='name'\">"
LINK = "[click](javascript:window.__xss='link')"
HOSTILE = yaml.safe_dump(
    {
        "domain": "shop",
        "descriptors": [
            {
                "key": "user",
                "value": VALUE,
                "rate_limit": {"name": NAME, "unit": "hour", "requests_per_unit": 1},
            },
            {
                "key": "path",
                "value": LINK,
                "rate_limit": {
                    "name": "**bold** <b onclick=alert(1)>b</b>",
                    "unit": "hour",
                    "requests_per_unit": 1,
                },
            },
        ],
    },
    sort_keys=False,
)


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'sluice.db'}"
    with PolicyStore(url) as store:
        store.upgrade()
        service = PolicyService(store)
        service.publish(load_text(HOSTILE), author=NAME, comment=f"comment {VALUE} {LINK}")
        # An override (its hits still make offenders) listed on the Overrides & blocks page.
        limit = {"requests_per_unit": 1, "unit": "hour"}
        service.put_pin(
            "shop", "overrides", f"path={LINK}", rate_limit=limit, author=NAME, comment=VALUE
        )
    return url


@pytest.fixture
def browser_page() -> Iterator[playwright.Page]:
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(30_000)  # two test workers share the CPUs
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        yield page
        assert dialogs == [], f"a script ran: {dialogs}"
        browser.close()


@pytest.mark.slow
def test_every_page_needs_a_sign_in_even_by_url(
    tmp_path: Path, database_url: str, browser_page: playwright.Page
) -> None:
    page = browser_page
    with run_admin(tmp_path, database_url) as url:
        for path in ("", *PAGES):
            page.goto(f"{url}/{path}")
            page.get_by_role("button", name="Sign in").wait_for()
            settle(page)
            # Streamlit may add a "Page not found" notice: the page is not registered at all.
            headings = set(page.get_by_role("heading").all_inner_texts())
            assert headings - {"Page not found"} == {"Sluice admin"}, (path, headings)
            assert page.get_by_text("shop").count() == 0  # no policy data leaks to the gate


@pytest.mark.slow
def test_user_written_text_is_shown_never_run(
    tmp_path: Path, database_url: str, browser_page: playwright.Page
) -> None:
    page = browser_page
    extra = ["--usage-flush-interval-s", "0.2"]
    with (
        sluice_serve(tmp_path, database_url=database_url, extra_args=extra) as server,
        grpc.insecure_channel(server.grpc_target) as channel,
        run_admin(tmp_path, database_url) as url,
    ):
        # Traffic with the hostile values, so they reach the usage pages as top offenders.
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        for key, value in (("user", VALUE), ("path", LINK)) * 3:
            entry = ratelimit_pb2.RateLimitDescriptor.Entry(key=key, value=value)
            request = rls_pb2.RateLimitRequest(
                domain="shop", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])]
            )
            stub.ShouldRateLimit(request, timeout=2)
        sign_in(page, url)
        for title in (
            "Rules",
            "Live usage",
            "What-if",
            "Overrides & blocks",
            "History",
            "Overview",
        ):
            page.get_by_role("link", name=title, exact=True).click()
            page.get_by_role("heading", name=title, exact=True).wait_for()
            settle(page)
            if title == "Rules":
                wait_until(lambda: page.get_by_text(VALUE).count() > 0, 10, "the value as text")
                assert page.get_by_text(NAME).count() > 0
                assert page.get_by_text(LINK).count() > 0
            if title == "Live usage":
                wait_until(
                    lambda: page.get_by_text(VALUE).count() > 0, 10, "the offender as text", 0.2
                )
                # An editor's buttons name the offending values: as text too.
                page.get_by_text("Let a key in again").first.click()
                page.get_by_role("button", name=f"Let {LINK} in again").wait_for()
            if title == "Overrides & blocks":
                page.get_by_text(f"path={LINK} · 1 / hour", exact=False).wait_for()
            assert page.evaluate("window.__xss") is None, title
            assert page.locator("img[src='x']").count() == 0, title
            assert page.locator("a[href^='javascript']").count() == 0, title
            assert page.locator("b[onclick]").count() == 0, title


@pytest.mark.slow
def test_an_oversized_upload_is_refused_and_nothing_published(
    tmp_path: Path, database_url: str, browser_page: playwright.Page
) -> None:
    page = browser_page
    huge = tmp_path / "huge.yaml"
    huge.write_text("domain: edge\ndescriptors: []\n" + "# padding\n" * 200_000)  # ~2 MB
    with run_admin(tmp_path, database_url) as url:
        sign_in(page, url)
        page.get_by_role("link", name="Import / export", exact=True).click()
        page.get_by_role("heading", name="Import / export", exact=True).wait_for()
        settle(page)
        page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(huge)
        page.get_by_text("File must be 1.0MB or smaller").wait_for()
        settle(page)
        assert page.get_by_role("button", name="Import").count() == 0
    with PolicyStore(database_url) as store:
        assert [view.domain for view in PolicyService(store).domains()] == ["shop"]


@pytest.mark.slow
def test_the_admin_app_serves_https_with_the_servers_certificate(
    tmp_path: Path, database_url: str
) -> None:
    pki = make_pki(tmp_path)
    args = ["--tls-cert-file", str(pki.server_cert), "--tls-key-file", str(pki.server_key)]
    with run_admin(tmp_path, database_url, args, https=pki.client_context()) as url:
        assert url.startswith("https://")
        with urllib.request.urlopen(url + "/_stcore/health", context=pki.client_context()) as r:
            assert r.status == 200
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # no plaintext beside it
            urllib.request.urlopen(url.replace("https", "http") + "/_stcore/health", timeout=5)


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_streamlits_metrics_are_closed_and_what_the_gate_needs_is_open(
    tmp_path: Path, database_url: str
) -> None:
    with run_admin(tmp_path, database_url) as url:
        # Streamlit's counters, to anyone and used by nothing here: closed (served.py).
        assert _status(url + "/_stcore/metrics") == 404
        assert _status(url + "/_stcore/metrics/") == 404
        # The browser asks these before it can show the sign-in form (docs/admin.md).
        assert _status(url + "/_stcore/health") == 200
        assert _status(url + "/_stcore/host-config") == 200
        assert _status(url + "/") == 200


def _websocket_handshake(url: str, origin: str) -> bytes:
    """The status line of the answer to a WebSocket upgrade of Streamlit's stream."""
    address = urllib.parse.urlsplit(url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
        sock.sendall(
            (
                f"GET /_stcore/stream HTTP/1.1\r\nHost: {address.netloc}\r\n"
                "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}\r\n"
                f"Origin: {origin}\r\n\r\n"
            ).encode()
        )
        return sock.recv(4096).split(b"\r\n", 1)[0]


def _upload(url: str, headers: dict[str, str]) -> tuple[int, bytes]:
    boundary = "sluice-test"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="p.yaml"\r\n'
        f"Content-Type: application/x-yaml\r\n\r\ndomain: x\r\n--{boundary}--\r\n"
    ).encode()
    request = urllib.request.Request(
        f"{url}/_stcore/upload_file/{uuid.uuid4()}/{uuid.uuid4()}",
        method="PUT",
        data=body,
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}", **headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_another_site_can_neither_open_the_websocket_nor_upload(
    tmp_path: Path, database_url: str
) -> None:
    with run_admin(tmp_path, database_url) as url:
        # A page on another site opening the app's WebSocket with the user's cookies.
        assert _websocket_handshake(url, "https://attacker.example") == b"HTTP/1.1 403 Forbidden"
        assert _websocket_handshake(url, url) == b"HTTP/1.1 101 Switching Protocols"

        # Uploads need the XSRF cookie's token in a header, which another site cannot read.
        with urllib.request.urlopen(url + "/_stcore/health", timeout=10) as response:
            cookie = response.headers["Set-Cookie"].split(";")[0]
        token = cookie.split("=", 1)[1]
        forged = "2|00000000|" + "00" * 16 + "|" + token.rsplit("|", 1)[1]
        refused = (403, b"XSRF token missing or invalid")
        assert _upload(url, {}) == refused
        assert _upload(url, {"Cookie": cookie}) == refused  # a browser sends the cookie itself
        assert _upload(url, {"Cookie": cookie, "X-Xsrftoken": forged}) == refused
        # With the token, the check passes: refused only for the session this test made up.
        status, body = _upload(url, {"Cookie": cookie, "X-Xsrftoken": token})
        assert (status, body.startswith(b"Invalid session_id")) == (400, True)
