"""``/docs`` in a real browser (Debian's chromium, headless): Swagger UI loads from the
server alone, under its content security policy, once a token is given; nothing is
fetched from anywhere else."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.apiserver import api_for_tests, serving
from tests.apps.api import build

playwright_api = pytest.importorskip("playwright.async_api")
expect = playwright_api.expect

CHROMIUM = os.environ.get("CONVEYOR_CHROMIUM", "/usr/bin/chromium")
WAIT_MS = 30_000

pytestmark = pytest.mark.timeout(180)


async def test_docs_work_offline_behind_a_token(tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run `bash scripts/setup` (it installs chromium)")
    app = build(f"sqlite:///{tmp_path / 'docs.db'}")
    _, secret = await app.create_token(tenant="acme", role="read")
    elsewhere: list[str] = []
    problems: list[str] = []
    with serving(app, api_for_tests(app)) as server:
        async with playwright_api.async_playwright() as p:
            browser = await p.chromium.launch(executable_path=CHROMIUM, headless=True)
            try:
                page = await browser.new_page()
                page.set_default_timeout(WAIT_MS)

                async def offline(route: Any) -> None:
                    if route.request.url.startswith(server.base_url):
                        await route.continue_()
                    else:
                        elsewhere.append(route.request.url)
                        await route.abort()

                await page.route("**/*", offline)

                def console(message: Any) -> None:
                    if message.type == "error":
                        problems.append(message.text)

                page.on("console", console)
                await page.goto(f"{server.base_url}/docs")
                await page.get_by_label("API token").fill("cvt_000000000000_wrongwrongwrong")
                await page.get_by_role("button", name="Show the API").click()
                await expect(page.locator("#problem")).to_contain_text("401")
                await page.get_by_label("API token").fill(secret)
                await page.get_by_role("button", name="Show the API").click()
                await expect(page.locator(".opblock-summary-path").first).to_be_visible(
                    timeout=WAIT_MS
                )
                await expect(page.locator(".information-container")).to_contain_text("conveyor")
            finally:
                await browser.close()
    await app.close()
    assert elsewhere == []
    # The only console error is the refused wrong token; no CSP violation.
    assert not [m for m in problems if "Content Security Policy" in m], problems
