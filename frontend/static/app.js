/* LST event browser: draw Plotly figures sent as JSON by the API, and follow jobs.
 *
 * - Any element with data-figure-url gets the figure JSON ({data, layout}) fetched from
 *   that URL and drawn with Plotly.newPlot (plotly.js is vendored: /static/vendor/).
 *   With data-click-url, a click on a point whose customdata is an id opens data-click-url + id.
 * - Any element .job-status[data-job-id] follows its job through the server-sent events
 *   of GET /api/v1/jobs/{id}/events (EventSource: "progress" events, then "end") and
 *   updates its progress bar; without EventSource, or when the stream cannot be opened,
 *   it polls GET /api/v1/jobs/{id} until the job has ended.
 * - With data-live-url (the job page), the page's parts marked [data-live][id] (queue, times,
 *   products) are fetched again from that URL as the job moves (at most every LIVE_MIN_MS
 *   while it runs, and always once it has ended), so they follow it to its end state: the
 *   server renders them, one template for the first view and the updates.
 * - The job form (#job-form) is frontend/static/job_form.js.
 */
(function () {
  "use strict";

  const FINAL_STATES = new Set(["succeeded", "failed", "cancelled"]);
  const POLL_MS = 1000;
  const LIVE_MIN_MS = 2000;

  /* The refresher of a job page's [data-live] parts: refresh(final) fetches the page again
   * (a change while running: at most every LIVE_MIN_MS; final: at once, and once more after
   * a fetch in flight, which may have read the job before it ended). */
  function liveParts(el) {
    const url = el.dataset.liveUrl;
    let busy = false, again = false, timer = null, last = 0;
    async function fetchParts() {
      if (busy) { again = true; return; }
      busy = true;
      last = Date.now();
      try {
        const resp = await fetch(url, { headers: { Accept: "text/html" }, credentials: "same-origin", cache: "no-store" });
        if (!resp.ok) throw new Error(resp.status + " " + resp.statusText);
        const doc = new DOMParser().parseFromString(await resp.text(), "text/html");
        document.querySelectorAll("[data-live][id]").forEach(function (old) {
          const fresh = doc.getElementById(old.id);
          if (fresh) old.replaceWith(document.importNode(fresh, true));
        });
        const shown = doc.querySelector(".job-status[data-job-id]");
        if (shown) el.dataset.liveState = shown.dataset.state;  // the job's state the parts show
        followDetections(el, fetchParts);
      } catch (err) {
        el.dataset.liveError = err.message;  // the parts stay as they were; the next change tries again
      } finally {
        busy = false;
        if (again) { again = false; fetchParts(); }
      }
    }
    followDetections(el, fetchParts);
    return function refresh(final) {
      if (final) {
        window.clearTimeout(timer);
        timer = null;
        fetchParts();
        return;
      }
      if (timer) return;
      timer = window.setTimeout(function () { timer = null; fetchParts(); }, Math.max(0, last + LIVE_MIN_MS - Date.now()));
    };
  }

  /* The detections a job queued when it ended settle after it (the job's own stream has
   * ended by then): while #job-detections-live says data-pending="true", the live parts are
   * fetched again, every 5 s at first and then less often (at most every 60 s, 40 times). */
  function followDetections(el, fetchParts) {
    if (el.detectionsTimer) return;
    let delay = 5000, tries = 0;
    function tick() {
      el.detectionsTimer = null;
      const box = document.getElementById("job-detections-live");
      if (!box || box.dataset.pending !== "true" || tries++ >= 40) return;
      fetchParts();
      delay = Math.min(60000, Math.round(delay * 1.5));
      el.detectionsTimer = window.setTimeout(tick, delay);
    }
    const box = document.getElementById("job-detections-live");
    if (box && box.dataset.pending === "true") el.detectionsTimer = window.setTimeout(tick, delay);
  }

  async function renderFigure(el) {
    const url = el.dataset.figureUrl;
    try {
      const resp = await fetch(url, { headers: { Accept: "application/json" } });
      const body = await resp.json();
      if (!resp.ok) throw new Error(body.detail || resp.statusText);
      el.innerHTML = "";
      await Plotly.newPlot(el, body.data, body.layout, { responsive: true, displaylogo: false, showSendToCloud: false });
      if (el.dataset.clickUrl) {
        el.on("plotly_click", function (ev) {
          const id = ev.points && ev.points[0] && ev.points[0].customdata;
          if (id !== undefined && id !== null) window.location.href = el.dataset.clickUrl + id;
        });
      }
    } catch (err) {
      el.innerHTML = "";
      const p = document.createElement("p");
      p.className = "error";
      p.textContent = "Could not draw the figure: " + err.message;
      el.appendChild(p);
    }
  }

  function updateJobStatus(el, job) {
    const counts = [job.total, job.done, job.failed, job.skipped, job.cancelled || 0].join("-");
    const state = el.querySelector(".job-state");
    state.textContent = job.state;
    state.className = "job-state state-" + job.state;
    const bar = el.querySelector(".job-progress");
    bar.value = job.progress;
    bar.textContent = Math.round(job.progress * 100) + "%";
    const cancelled = job.cancelled ? ` · ${job.cancelled} cancelled` : "";
    el.querySelector(".job-counts").textContent =
      `${job.done} done · ${job.failed} failed · ${job.skipped} skipped${cancelled} · ${job.total} frames`;
    const err = el.querySelector(".job-error");
    if (job.error) {
      err.textContent = job.error;
      err.hidden = false;
    } else {
      err.hidden = true;
    }
    const moved = el.dataset.state !== job.state || el.dataset.counts !== counts;
    el.dataset.state = job.state;
    el.dataset.counts = counts;
    if (el.liveRefresh && (moved || FINAL_STATES.has(job.state) && el.dataset.liveState !== job.state)) {
      el.liveRefresh(FINAL_STATES.has(job.state));
    }
  }

  function pollJob(el) {
    const url = el.dataset.jobUrl;
    let delay = POLL_MS;
    async function poll() {
      try {
        const resp = await fetch(url, { headers: { Accept: "application/json" } });
        const body = await resp.json();
        if (!resp.ok) throw new Error(body.detail || resp.statusText);
        updateJobStatus(el, body);
        delay = POLL_MS;
        if (FINAL_STATES.has(body.state)) return;
      } catch (err) {
        const e = el.querySelector(".job-error");
        e.textContent = "Could not read the job (" + err.message + "); retrying";
        e.hidden = false;
        delay = Math.min(delay * 2, 15000);
      }
      window.setTimeout(poll, delay);
    }
    poll();
  }

  function followJob(el) {
    if (el.dataset.liveUrl) {
      el.dataset.liveState = el.dataset.state;  // as the page was rendered
      el.liveRefresh = liveParts(el);
    }
    if (typeof window.EventSource !== "function") {
      el.dataset.follow = "polling";
      pollJob(el);
      return;
    }
    el.dataset.follow = "events";
    const source = new EventSource(el.dataset.jobUrl + "/events");
    function show(ev) {
      updateJobStatus(el, JSON.parse(ev.data));
    }
    source.addEventListener("progress", show);
    source.addEventListener("end", function (ev) {
      show(ev);
      source.close(); // the server closes the stream; without this the browser would reconnect
    });
    source.onerror = function () {
      // CONNECTING: the browser reconnects by itself (retry:); CLOSED: the stream was refused
      if (source.readyState === EventSource.CLOSED && !FINAL_STATES.has(el.dataset.state)) {
        el.dataset.follow = "polling";
        pollJob(el);
      }
    };
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-figure-url]").forEach(renderFigure);
    document.querySelectorAll("main > .job-status[data-job-id]").forEach(followJob);
  });

  window.LSTDP = { renderFigure: renderFigure, followJob: followJob, pollJob: pollJob, updateJobStatus: updateJobStatus };
})();
