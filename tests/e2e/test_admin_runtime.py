"""The Leases and RLQS buckets pages in a real browser, from a real server: leases held
through the Python client and an RLQS stream open over gRPC, as the admin app shows them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright import sync_api as playwright

from sluice_client import Client
from tests.e2e.browser import CHROMIUM, CHROMIUM_ARGS, Outbound, run_admin, settle, sign_in
from tests.e2e.test_admin_browser import DOC_SCREENSHOTS
from tests.integration.test_rlqs_server import Response, Stream, report
from tests.integration.test_runtime_api import POLICY  # one policy, three views of it
from tests.support.processes import sluice_serve

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TOKEN = "browser-runtime-token"


def grid_rows(page: playwright.Page, cell: str) -> list[list[str]]:
    """The cells of the page's table, once one of them reads ``cell``: a dataframe is drawn
    on a canvas, and glide-data-grid keeps its cells' text in a table inside it for screen
    readers (attached, never visible)."""
    grid = page.locator('table[role="grid"]').first
    grid.locator("td", has_text=cell).first.wait_for(state="attached")
    return [row.locator("td").all_text_contents() for row in grid.locator("tbody tr").all()]


def test_held_leases_and_an_rlqs_bucket_with_its_assignment(tmp_path: Path) -> None:
    config = tmp_path / "policy.yaml"
    config.write_text(POLICY)
    database_url = f"sqlite:///{tmp_path / 'sluice.db'}"
    admin_args = ["--admin-servers", "", "--api-token", TOKEN]
    with (
        sluice_serve(
            tmp_path, config=config, database_url=database_url, extra_args=["--api-token", TOKEN]
        ) as server,
        Client(server.grpc_target, on_unavailable="raise") as client,
    ):
        admin_args[1] = server.http_url
        held = [client.lease("jobs", {"job": job}) for job in ("nightly", "nightly", "hourly")]
        assert all(lease.granted for lease in held)
        stream = Stream(server)
        try:
            stream.send(report("jobs", {"tenant": "acme"}))
            assert isinstance(stream.next(), Response)
            # A second of the data plane's traffic: 12 requests asked, 10 let through.
            traffic = report("jobs", {"tenant": "acme"})
            usage = traffic.bucket_quota_usages[0]
            usage.time_elapsed.FromSeconds(1)
            usage.num_requests_allowed, usage.num_requests_denied = 10, 2
            stream.send(traffic)
            assert isinstance(stream.next(), Response)
            with (
                run_admin(tmp_path, database_url, admin_args) as url,
                playwright.sync_playwright() as p,
            ):
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                context = browser.new_context(viewport={"width": 1400, "height": 900})
                outbound = Outbound(url)
                context.route("**/*", outbound.route)
                page = context.new_page()
                page.set_default_timeout(30_000)
                sign_in(page, url)
                update = os.environ.get("SLUICE_UPDATE_SCREENSHOTS")
                target = DOC_SCREENSHOTS if update else tmp_path

                page.get_by_role("link", name="Leases", exact=True).click()
                page.get_by_role("heading", name="Leases", exact=True).wait_for()
                settle(page)
                page.get_by_text("3 leases held on 2 descriptors of jobs").wait_for()
                rows = grid_rows(page, "job=nightly")
                page.screenshot(path=str(target / "leases.png"))
                assert [r[:4] for r in rows] == [
                    ["job=nightly", "jobs.job", "2", "3"],
                    ["job=hourly", "jobs.job", "1", "3"],
                ], rows

                page.get_by_role("link", name="RLQS buckets", exact=True).click()
                page.get_by_role("heading", name="RLQS buckets", exact=True).wait_for()
                settle(page)
                [row] = grid_rows(page, "tenant=acme")
                page.screenshot(path=str(target / "rlqs.png"))
                assert row[1:4] == [
                    "tenant=acme",
                    "jobs.tenant",
                    "token bucket: 10 every second, at most 10",
                ], row
                assert row[7] == "12 / s", row  # the demand reported
                assert outbound.refused == []
                browser.close()
        finally:
            stream.close()
            for lease in held:
                lease.release()
