"""The frame player and the MP4 button in a real Chromium (Debian's, driven by Playwright).

The app is served by uvicorn in a thread on a temporary SQLite database holding the
simulator's 13-frame SDI series calibrated by the real writer (``tests.test_movies.build_store``)
and the injected flare as an FL event. No worker runs: the test renders the movie the page
asked for in-process (the task's function) and the page follows it to its download link.
Screenshots go to each test's ``tmp_path``.
"""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pytest

from tests.test_browser import boxes_in_one_layout, served_app, browser, page  # noqa: F401 - fixtures
from tests.test_movies import build_store, simulated, submit_session  # noqa: F401 - fixture

pytestmark = pytest.mark.browser


@pytest.fixture
def live(sqlite_env, simulated):  # noqa: F811
    from tests.test_api import route_celery_to_this_data_dir

    ids = build_store(sqlite_env, simulated)
    route_celery_to_this_data_dir()
    with served_app() as url:
        yield SimpleNamespace(url=url, ids=ids, settings=sqlite_env)


def _shown(d: dt.datetime) -> str:
    return d.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _date_obs(page) -> str:
    return page.locator("#movie-date-obs").inner_text()


def test_player_plays_steps_slides_and_shows_events_as_they_start(live, page, tmp_path):  # noqa: F811
    ids = live.ids
    start = (ids.dates[0] - dt.timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S")
    end = (ids.dates[-1] + dt.timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S")
    page.goto(f"{live.url}/movies?channel=SDI&start={start}&end={end}")
    page.wait_for_selector("#movie-player[data-ready=true]")
    n = len(ids.dates)
    assert _date_obs(page) == _shown(ids.dates[0]) and page.locator("#movie-index").inner_text() == f"1 / {n}"
    flare = page.locator(f"#movie-events li[data-event-id='{ids.flare}']")
    assert flare.count() == 1 and flare.is_hidden()  # the flare starts at 03:00: not yet
    assert page.locator(".movie-marker").count() == 0
    page.screenshot(path=str(tmp_path / "movie-first-frame.png"), full_page=True)

    page.click("#movie-forward")
    assert _date_obs(page) == _shown(ids.dates[1])
    page.click("#movie-forward")
    page.click("#movie-back")
    assert _date_obs(page) == _shown(ids.dates[1])

    # the slider to the frame of 04:00 (the flare started at 03:00:11, it peaks at 05:00)
    k = next(i for i, d in enumerate(ids.dates) if d >= dt.datetime.fromisoformat(ids.truth.start).replace(
        tzinfo=dt.UTC) + dt.timedelta(seconds=1))
    page.locator("#movie-slider").evaluate(f"(el) => {{ el.value = '{k}'; el.dispatchEvent(new Event('input')); }}")
    assert _date_obs(page) == _shown(ids.dates[k])
    assert flare.is_visible() and "GOES M2.0" in flare.inner_text()
    cme = page.locator(f"#movie-events li[data-event-id='{ids.cme}']")
    assert cme.is_hidden()  # starts at the flare's peak
    # the flare's marker sits where the frame's WCS puts it (server-side), on the image
    marker = page.locator(f".movie-marker[data-event-id='{ids.flare}']")
    page.wait_for_selector(f".movie-marker[data-event-id='{ids.flare}']")
    img, mb = boxes_in_one_layout(page, page.locator("#movie-frame"), marker)
    frames = page.evaluate("fetch(document.getElementById('movie-player').dataset.framesUrl).then(r => r.json())")
    fx, fy = frames["frames"][k]["markers"][str(ids.flare)]
    cx, cy = mb["x"] + mb["width"] / 2, mb["y"] + mb["height"] / 2
    assert abs(cx - (img["x"] + fx * img["width"])) < 2 and abs(cy - (img["y"] + fy * img["height"])) < 2
    # the flare is on the south-east quadrant (hpc -400", -350"): left of and below the centre
    assert cx < img["x"] + img["width"] / 2 and cy > img["y"] + img["height"] / 2
    page.screenshot(path=str(tmp_path / "movie-flare-marked.png"), full_page=True)

    # play at 20 frames/s: DATE-OBS moves on by itself and stops at the last frame
    page.select_option("#movie-speed", "20")
    before = _date_obs(page)
    # the player's states, as it changes them: at 20 frames/s the whole run can end before a
    # read of the button right after the click (a busy test process), so none is read then
    page.evaluate("""() => {
        const root = document.getElementById('movie-player'), btn = document.getElementById('movie-play');
        window.playStates = [];
        new MutationObserver(() => window.playStates.push([root.dataset.playing, btn.textContent]))
            .observe(root, {attributes: true, attributeFilter: ['data-playing']});
    }""")
    page.click("#movie-play")
    page.wait_for_function(f"document.getElementById('movie-date-obs').textContent !== {before!r}")
    page.wait_for_function("window.playStates.some(([playing]) => playing === 'false')")
    assert page.evaluate("window.playStates") == [["true", "Pause"], ["false", "Play"]]
    assert _date_obs(page) == _shown(ids.dates[-1]) and page.locator("#movie-index").inner_text() == f"{n} / {n}"
    assert cme.is_visible()
    assert page.locator(".movie-marker").count() == 0  # the flare ended at 09:00
    page.screenshot(path=str(tmp_path / "movie-last-frame.png"), full_page=True)

    # a running difference of the same window: one frame fewer, grey images
    page.select_option("#movie-form-diff", "running")
    page.click("#movie-form button[type=submit]")
    page.wait_for_selector("#movie-player[data-ready=true]")
    assert page.locator("#movie-index").inner_text() == f"1 / {n - 1}" and _date_obs(page) == _shown(ids.dates[1])
    assert "/api/v1/movies/frames/" in page.locator("#movie-frame").get_attribute("src")
    page.locator("#movie-slider").evaluate(f"(el) => {{ el.value = '{k}'; el.dispatchEvent(new Event('input')); }}")
    page.wait_for_function("document.getElementById('movie-frame').complete")
    page.screenshot(path=str(tmp_path / "movie-running-difference.png"), full_page=True)
    assert page.js_errors == []


def test_event_page_player_makes_an_mp4_and_offers_it(live, page, tmp_path):  # noqa: F811
    from backend.db import session_scope
    from backend.worker.movies import make_movie

    ids = live.ids
    # asking for a movie needs a token with jobs:submit: the browser carries it as its session cookie
    page.context.add_cookies([{"name": "lstdp_session", "value": submit_session(), "url": live.url}])
    page.goto(f"{live.url}/events/{ids.flare}")
    page.wait_for_selector("#event-movie #movie-player[data-ready=true]")
    # the window is the flare's ± 30 min: 03:00:11 - 30 min to 09:00:10 + 30 min
    t0 = dt.datetime.fromisoformat(ids.truth.start).replace(tzinfo=dt.UTC) - dt.timedelta(minutes=30)
    t1 = dt.datetime.fromisoformat(ids.truth.end).replace(tzinfo=dt.UTC) + dt.timedelta(minutes=30)
    inside = [d for d in ids.dates if t0 <= d <= t1]
    assert page.locator("#movie-index").inner_text() == f"1 / {len(inside)}"
    assert _date_obs(page) == _shown(inside[0])
    assert page.locator("#event-movie-link").get_attribute("href") == f"/movies?event={ids.flare}"

    page.fill("#movie-fps", "6")
    # an event's player offers its marker and its crop (issue 25); the chosen size goes with them
    assert page.locator("#movie-event-options").is_visible() and page.locator("#movie-mark").is_checked()
    page.check("#movie-crop")
    page.select_option("#movie-size", "512")
    page.click("#movie-make")
    page.wait_for_function("document.getElementById('movie-player').dataset.movieId")
    movie_id = page.locator("#movie-player").get_attribute("data-movie-id")
    page.wait_for_selector("#movie-status.state-queued")
    assert "0 of " + str(len(inside)) in page.locator("#movie-status").inner_text()
    page.locator("#event-movie").screenshot(path=str(tmp_path / "event-movie-queued.png"))
    with session_scope() as s:  # the worker's part, in this process
        assert make_movie(s, movie_id, live.settings).frames_done == len(inside)
    page.wait_for_selector("#movie-download:not([hidden])")
    status = page.locator("#movie-status").inner_text()
    assert status.startswith(f"succeeded: {len(inside)} of {len(inside)} frames") and "512×" in status, status
    asked = page.request.get(f"{live.url}/api/v1/movies/{movie_id}").json()
    assert (asked["event"], asked["size"], asked["crop"], len(asked["crop_box"] or [])) == (ids.flare, 512, True, 4), asked
    href = page.locator("#movie-download").get_attribute("href")
    assert href == f"/api/v1/movies/{movie_id}/file"
    r = page.request.get(live.url + href)
    assert r.status == 200 and r.headers["content-type"] == "video/mp4" and r.body()[4:8] == b"ftyp"
    page.screenshot(path=str(tmp_path / "event-movie.png"), full_page=True)
    assert page.js_errors == []


def test_a_frame_that_fails_to_load_is_marked_retried_and_shown(live, page, tmp_path):  # noqa: F811
    """Issue 25 (movies): a frame whose image fails (a 503, by route interception) is marked
    on the stage and in the list, tried again with a fresh URL and shown; one that fails
    every time is marked as not loaded after the bounded retries."""
    ids = live.ids
    n = len(ids.dates)
    # the player preloads the 5 frames after the one shown: shown 1 then 9, neither 9 nor 7 is asked for before
    k, dead = 8, 6
    seen: dict[int, list[str]] = {k: [], dead: []}

    def handler(j, fail_first):
        def handle(route):
            seen[j].append(route.request.url)
            if len(seen[j]) <= fail_first:
                route.fulfill(status=503, body="busy", content_type="text/plain")
            else:
                route.continue_()
        return handle

    page.route(f"**/api/v1/products/{ids.products[k]}/quicklook.png*", handler(k, 1))
    page.route(f"**/api/v1/products/{ids.products[dead]}/quicklook.png*", handler(dead, 99))
    start = (ids.dates[0] - dt.timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S")
    end = (ids.dates[-1] + dt.timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S")
    page.goto(f"{live.url}/movies?channel=SDI&start={start}&end={end}")
    page.wait_for_selector("#movie-player[data-ready=true]")
    assert page.locator("#movie-frame-error").is_hidden() and page.locator("#movie-failed").is_hidden()
    # every state the stage's mark goes through, as the player sets it
    page.evaluate("""() => {
        const stage = document.getElementById('movie-stage'), note = document.getElementById('movie-frame-error');
        window.marks = [];
        const record = () => window.marks.push([stage.classList.contains('frame-failed'), note.hidden, note.textContent]);
        new MutationObserver(record).observe(stage, {attributes: true, attributeFilter: ['class'], subtree: true,
                                                     childList: true, characterData: true});
    }""")
    page.locator("#movie-slider").evaluate(f"(el) => {{ el.value = '{k}'; el.dispatchEvent(new Event('input')); }}")
    page.wait_for_function(f"""() => {{
        const img = document.getElementById('movie-frame');
        return img.dataset.frame === '{k}' && img.complete && img.naturalWidth > 0 && img.src.includes('retry=1')
            && !document.getElementById('movie-stage').classList.contains('frame-failed');
    }}""", timeout=20000)
    marks = page.evaluate("window.marks")
    assert [True, False, f"Frame {k + 1} failed to load: trying again (1 of 3)…"] in marks, marks
    assert marks[-1][:2] == [False, True], marks  # the mark is gone once the frame is shown
    assert len(seen[k]) == 2 and "retry" not in seen[k][0] and seen[k][1].endswith("?retry=1"), seen[k]
    assert page.locator("#movie-frame-error").is_hidden()
    assert page.locator("#movie-failed").inner_text() == f"Frames that failed to load: {k + 1} (loaded on a retry)"
    assert _date_obs(page) == _shown(ids.dates[k]) and page.locator("#movie-index").inner_text() == f"{k + 1} / {n}"
    page.screenshot(path=str(tmp_path / "movie-frame-retried.png"), full_page=True)

    # a frame that never loads: the first try and MAX_RETRIES (3) more, then marked as not loaded
    page.locator("#movie-slider").evaluate(f"(el) => {{ el.value = '{dead}'; el.dispatchEvent(new Event('input')); }}")
    page.wait_for_function("document.getElementById('movie-frame-error').textContent.includes('could not be loaded')",
                           timeout=30000)
    assert page.locator("#movie-frame-error").is_visible()
    assert page.locator("#movie-frame-error").inner_text() == f"Frame {dead + 1} could not be loaded (4 tries)."
    assert [u.rsplit("?", 1)[-1] if "?" in u else "" for u in seen[dead]] == ["", "retry=1", "retry=2", "retry=3"]
    assert page.locator("#movie-player").get_attribute("data-failed-frames") == str(dead + 1)
    assert f"{dead + 1} (could not be loaded)" in page.locator("#movie-failed").inner_text()
    page.screenshot(path=str(tmp_path / "movie-frame-dead.png"), full_page=True)
    # stepping on shows the next frame, unmarked
    page.click("#movie-forward")
    page.wait_for_function("document.getElementById('movie-frame').complete")
    assert page.locator("#movie-frame-error").is_hidden() and _date_obs(page) == _shown(ids.dates[dead + 1])
    assert [e for e in page.js_errors if "503" not in e] == []
