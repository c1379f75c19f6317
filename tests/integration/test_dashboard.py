"""The dashboard in headless Chromium (Debian's, driven by Playwright) against a running manager
whose agents report a moving load: the page opens on the manager's history, the charts fill with
data and keep updating, events are marked, rows say why; a screenshot is kept in
artifacts/dashboard.png."""

from __future__ import annotations

import math
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.dashboard import CHART_JS
from tests.api_support import ADMIN, READ, RunningManager, bearer, running_manager, wait_for

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
CHARTS = ["utilization", "weight", "ttl", "paused", "pool", "cost"]

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not CHROMIUM.exists() and shutil.which("chromium") is None,
        reason="chromium is not installed (apt-get install chromium)",
    ),
]


def load(server_id: str, now: float) -> int:
    """www: each server on its own wave, now and then above th_over; auto: busy (above th_high,
    below th_over), so it scales out."""
    if server_id.startswith("auto"):
        return 75
    phase = int(server_id[-1])
    return max(0, min(100, int(55 + 40 * math.sin(now / 3 + phase * 2))))


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[RunningManager]:
    assert CHART_JS.is_file(), "the chart library is missing from api/static/vendor/"
    with running_manager(tmp_path, load=load) as running:
        yield running


@pytest.fixture
def page(manager: RunningManager) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright  # noqa: PLC0415

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM if CHROMIUM.exists() else shutil.which("chromium")),
            args=ARGS,
        )
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            yield context.new_page()
        finally:
            browser.close()


POINTS = """() => Object.fromEntries(Object.entries(window.dnslb.charts).map(([name, chart]) =>
    [name, chart.data.datasets.reduce((n, d) => n + d.data.filter((p) => p.y !== null).length, 0)]
))"""

INK = """(name) => {
    const canvas = window.dnslb.charts[name].canvas;
    const pixels = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
    let inked = 0;
    for (let i = 3; i < pixels.length; i += 4) if (pixels[i] !== 0) inked += 1;
    return {inked, image: canvas.toDataURL()};
}"""


MARKED = """(kind) => window.dnslb.markers.filter((m) => m.kind === kind).length"""

# The pixels of the utilization chart's area in the colour of operator marks (#9467bd).
MARK_INK = """() => {
    const chart = window.dnslb.charts.utilization;
    const canvas = chart.canvas;
    const pixels = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
    let found = 0;
    for (let i = 0; i < pixels.length; i += 4) {
        if (pixels[i] === 0x94 && pixels[i + 1] === 0x67 && pixels[i + 2] === 0xbd) found += 1;
    }
    return found;
}"""


def history_samples(manager: RunningManager) -> int:
    answer = httpx.get(f"{manager.url}/v1/history?pool=www", headers=bearer(READ), timeout=5)
    return len(answer.json()["samples"])


def test_the_dashboard_draws_live_data_and_keeps_updating(
    manager: RunningManager, page: Any
) -> None:
    # Some history to open on, and an operator's pause the page must mark and explain.
    wait_for(lambda: history_samples(manager) >= 2, what="two history samples", timeout=30)
    paused = httpx.post(
        f"{manager.url}/v1/servers/s2/actions",
        json={"action": "pause", "reason": "dashboard test"},
        headers=bearer(ADMIN),
        timeout=5,
    )
    assert paused.status_code == 200, paused.text
    wait_for(lambda: history_samples(manager) >= 3, what="a sample with the pause", timeout=30)
    problems: list[str] = []
    elsewhere: list[str] = []
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.on(
        "console",
        lambda message: problems.append(message.text) if message.type == "error" else None,
    )
    page.on(
        "request",
        lambda request: (
            None if request.url.startswith(manager.url) else elsewhere.append(request.url)
        ),
    )

    page.goto(f"{manager.url}/")
    assert page.url == f"{manager.url}/dashboard/"
    page.fill("#token", READ)
    page.click("#login button[type=submit]")
    page.wait_for_function("() => window.dnslb.polls >= 2", timeout=30_000)
    assert READ not in page.url
    assert page.evaluate("sessionStorage.getItem('dnslb.api-token')") == READ

    # The page opened on the manager's history: points from before it was opened, and marks.
    assert page.evaluate("window.dnslb.historySamples") >= 3
    opened = page.evaluate("window.dnslb.openedAt")
    earliest = page.evaluate(
        """() => Math.min(...window.dnslb.charts.utilization.data.datasets
            .flatMap((d) => d.data.map((p) => p.x)))"""
    )
    assert earliest < opened - 5
    assert page.evaluate(MARKED, "admin_pause") == 1
    assert page.evaluate(MARKED, "state") > 0  # servers became active, the pool grew
    assert page.evaluate(MARK_INK) > 0  # the operator's pause is drawn on the chart
    rows = {
        row.locator("td").first.inner_text(): row.locator("td").last.inner_text()
        for row in page.locator("#servers tbody tr").all()
    }
    assert rows["s2"].startswith("paused by an operator (dashboard test) until resumed")
    assert all(rows[s] for s in ("s1", "s3")), rows
    # The intended share (weight) and the delivered share (load) of each server, by heading.
    headings = page.locator("#servers thead th").all_inner_texts()
    weight = headings.index("weight")
    intended, delivered = headings.index("intended"), headings.index("delivered")
    shares = {
        cells[0]: (cells[weight], cells[intended], cells[delivered])
        for cells in (
            row.locator("td").all_inner_texts() for row in page.locator("#servers tbody tr").all()
        )
    }
    assert shares["s2"][1] == "-"  # paused by the operator: no answers meant for it
    assert shares["s2"][2].endswith(" %"), shares  # but still carrying load
    # an intended share exactly where the plan answers the server (a weight)
    assert all((w == "-") == (i == "-") for w, i, _ in shares.values()), shares
    assert any(i.endswith(" %") for _, i, _ in shares.values()), shares

    first = page.evaluate(POINTS)
    assert all(first[name] > 0 for name in CHARTS), first
    before = {name: page.evaluate(INK, name) for name in CHARTS}
    assert all(before[name]["inked"] > 0 for name in CHARTS)
    servers = page.locator("#servers tbody tr").count()
    assert servers >= 4  # s1, s2, s3 and at least one server of the autoscaled pool

    polls = page.evaluate("window.dnslb.polls")
    page.wait_for_function(f"() => window.dnslb.polls >= {polls + 2}", timeout=30_000)
    second = page.evaluate(POINTS)
    assert all(second[name] > first[name] for name in CHARTS), (first, second)
    after = {name: page.evaluate(INK, name) for name in CHARTS}
    assert all(after[name]["image"] != before[name]["image"] for name in CHARTS)

    # The busy pool scales out: its size grows on the chart and a scale event is marked.
    page.wait_for_function(
        """() => {
            const chart = window.dnslb.charts.pool;
            const auto = chart.data.datasets.find(d => d.key === "auto");
            const events = chart.data.datasets.find(d => d.key === "scale events");
            return auto && auto.data.some(p => p.y > 1) && events && events.data.length > 0;
        }""",
        timeout=60_000,
    )
    page.wait_for_function(f"() => window.dnslb.polls >= {polls + 3}", timeout=30_000)
    assert page.locator("#events li").count() > 0
    assert "ready" in page.inner_text("#summary")

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
    assert problems == []
    assert elsewhere == [], "the page fetched from another origin (it must work offline)"


def test_a_refused_token_brings_back_the_login_form(manager: RunningManager, page: Any) -> None:
    page.goto(f"{manager.url}/dashboard/")
    page.fill("#token", "not-a-token")
    page.click("#login button[type=submit]")
    page.wait_for_selector("#login:not([hidden])", timeout=30_000)
    assert "token not valid" in page.inner_text("#login-error")
    assert page.evaluate("sessionStorage.getItem('dnslb.api-token')") is None
    assert page.evaluate("window.dnslb.polls") == 0
