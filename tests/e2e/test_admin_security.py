"""The admin app's defences, in a real browser:

- no page is reachable without signing in, not even by its URL;
- rule names and descriptor values (user-written, and echoed back from live traffic) are
  shown as text, never run as HTML, script or a link, on any page;
- the Import page refuses an oversized file and publishes nothing.
"""

from __future__ import annotations

import urllib.error
import urllib.request
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

PAGES = ("overview", "rules", "live", "what_if", "history", "transfer")
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
        PolicyService(store).publish(
            load_text(HOSTILE), author=NAME, comment=f"comment {VALUE} {LINK}"
        )
    return url


@pytest.fixture
def browser_page() -> Iterator[playwright.Page]:
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(15_000)
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        yield page
        assert dialogs == [], f"a script ran: {dialogs}"
        browser.close()


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
        for title in ("Rules", "Live usage", "What-if", "History", "Overview"):
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
            assert page.evaluate("window.__xss") is None, title
            assert page.locator("img[src='x']").count() == 0, title
            assert page.locator("a[href^='javascript']").count() == 0, title
            assert page.locator("b[onclick]").count() == 0, title


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
