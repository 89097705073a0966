/* Follows the demo's progress box of the landing page (frontend/templates/_demo_progress.html):
 * it fetches this page again (every 3 s at first, backing off to 30 s) and swaps the box for the new one; when the demo says it is
 * ready (the box is gone from the new page) it says so and offers a reload, which shows the events.
 * A failed fetch is retried at the next tick; nothing is reloaded without the user. */
(function () {
  "use strict";
  const box = document.getElementById("demo-progress");
  if (!box || box.dataset.state !== "running") return;
  // every 3 s at first, then less often (at most every 30 s); given up after an hour
  const started = Date.now();
  let delay = 3000;
  async function tick() {
    if (Date.now() - started > 3600 * 1000) return;
    let html = null;
    try {
      const resp = await fetch(location.href, { credentials: "same-origin", headers: { Accept: "text/html" } });
      if (resp.ok) html = await resp.text();
    } catch (e) {
      html = null;
    }
    delay = Math.min(30000, Math.round(delay * 1.3));
    const current = document.getElementById("demo-progress");
    if (!current) return;
    if (html === null) { setTimeout(tick, delay); return; }
    const fresh = new DOMParser().parseFromString(html, "text/html").getElementById("demo-progress");
    if (fresh) {
      current.replaceWith(fresh);
      if (fresh.dataset.state === "running") setTimeout(tick, delay);
      return;
    }
    current.dataset.state = "ready";
    current.innerHTML = '<h2 id="demo-progress-title">The demo is ready</h2>' +
      '<p>Every step has ended. <a href="" id="demo-progress-reload">Reload the page</a> to see its events.</p>';
  }
  setTimeout(tick, delay);
})();
