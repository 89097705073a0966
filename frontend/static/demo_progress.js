/* Follows the demo's progress box of the landing page (frontend/templates/_demo_progress.html):
 * every 3 s it fetches this page again and swaps the box for the new one; when the demo says it is
 * ready (the box is gone from the new page) it says so and offers a reload, which shows the events.
 * A failed fetch is retried at the next tick; nothing is reloaded without the user. */
(function () {
  "use strict";
  const box = document.getElementById("demo-progress");
  if (!box || box.dataset.state !== "running") return;
  const timer = setInterval(async function () {
    let html;
    try {
      const resp = await fetch(location.href, { credentials: "same-origin", headers: { Accept: "text/html" } });
      if (!resp.ok) return;
      html = await resp.text();
    } catch (e) {
      return;
    }
    const fresh = new DOMParser().parseFromString(html, "text/html").getElementById("demo-progress");
    const current = document.getElementById("demo-progress");
    if (!current) { clearInterval(timer); return; }
    if (fresh) {
      current.replaceWith(fresh);
      if (fresh.dataset.state !== "running") clearInterval(timer);
      return;
    }
    clearInterval(timer);
    current.dataset.state = "ready";
    current.innerHTML = '<h2 id="demo-progress-title">The demo is ready</h2>' +
      '<p>Every step has ended. <a href="" id="demo-progress-reload">Reload the page</a> to see its events.</p>';
  }, 3000);
})();
