/* The events page's landing timeline and its UTC time fields.
 *
 * #timeline[data-timeline-url]: the figure of GET /api/v1/events/histogram/figure for the
 * page's filters (counts of ALL matching events per type and time bin, or each event when
 * 500 or fewer are in view). Zooming (drag, or a click on a bar) asks the server for the
 * window in view, so the bins follow the zoom and a small enough window drills down to
 * the events (a click on one opens its page). The zoom is kept in the page URL as
 * tl_start / tl_end (replaceState): a reload or a shared link shows the same view.
 * Double-click (autorange) shows the whole search again. The events list under it
 * (#event-list) follows the zoom: it is read again from the page at the new URL.
 *
 * input[data-utc-time]: ISO 8601 text in UTC (no browser-local picker); a value that is not
 * one is marked and explained next to the field, and the form is not sent with it.
 */
(function () {
  "use strict";

  const ISO_UTC = /^\s*\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?\s*(?:Z|[+-]\d{2}:?\d{2})?\s*$/i;

  /* A Plotly date-axis value ("2024-05-10 06:00:00.123", UTC, or ms) as ISO 8601 UTC. */
  function axisToIso(v) {
    if (typeof v === "number") return new Date(v).toISOString();
    let s = String(v).trim().replace(" ", "T");
    if (/^\d{4}-\d{2}-\d{2}$/.test(s)) s += "T00:00:00";
    if (!/(Z|[+-]\d{2}:?\d{2})$/i.test(s)) s += "Z";
    const d = new Date(s);
    return isNaN(d.getTime()) ? null : d.toISOString();
  }

  function later(a, b) { if (!a) return b; if (!b) return a; return new Date(a) > new Date(b) ? a : b; }
  function earlier(a, b) { if (!a) return b; if (!b) return a; return new Date(a) < new Date(b) ? a : b; }

  function initTimeline(el) {
    const base = el.dataset.timelineUrl;
    const w0 = el.dataset.windowStart || null;
    const w1 = el.dataset.windowEnd || null;
    let z0 = el.dataset.tlStart || null;
    let z1 = el.dataset.tlEnd || null;
    let drawing = false;
    let bound = false;
    const reset = document.getElementById("timeline-reset");

    function keepInUrl() {
      const u = new URL(window.location.href);
      const view = function () { return u.searchParams.get("tl_start") + "/" + u.searchParams.get("tl_end"); };
      const was = view();
      if (z0 && z1) { u.searchParams.set("tl_start", z0); u.searchParams.set("tl_end", z1); }
      else { u.searchParams.delete("tl_start"); u.searchParams.delete("tl_end"); }
      const changed = view() !== was;
      if (changed) { u.searchParams.delete("after"); u.searchParams.delete("before"); }  // a new list: its first page
      window.history.replaceState(null, "", u.toString());
      if (reset) reset.hidden = !(z0 && z1);
      if (changed) refreshList();
      // the list's page links keep the view too
      document.querySelectorAll("#event-pager a").forEach(function (a) {
        const l = new URL(a.href, window.location.origin);
        if (z0 && z1) { l.searchParams.set("tl_start", z0); l.searchParams.set("tl_end", z1); }
        else { l.searchParams.delete("tl_start"); l.searchParams.delete("tl_end"); }
        a.href = l.pathname + l.search;
      });
    }

    function zoom(a, b) {
      if (!a || !b || new Date(b) <= new Date(a)) return;
      z0 = a; z1 = b;
      keepInUrl();
      load();
    }

    /* The events list (#event-list) follows the zoom: the page at the new URL (tl_start/tl_end)
     * is read and its list put in place of this one (the server cuts the search to the view). */
    let listAsked = 0;
    async function refreshList() {
      const list = document.getElementById("event-list");
      if (!list) return;
      const mine = ++listAsked;
      list.setAttribute("aria-busy", "true");
      try {
        const resp = await fetch(window.location.href, { headers: { Accept: "text/html" } });
        const html = await resp.text();
        if (mine !== listAsked) return;
        if (!resp.ok) throw new Error(resp.status + " " + resp.statusText);
        const fresh = new DOMParser().parseFromString(html, "text/html").getElementById("event-list");
        if (!fresh) throw new Error("no list in the answer");
        list.replaceWith(document.importNode(fresh, true));
        el.dataset.listZoom = (z0 && z1) ? z0 + "/" + z1 : "";
        const stale = document.getElementById("event-list-error");  // an earlier failure's note
        if (stale) stale.remove();
      } catch (err) {
        if (mine !== listAsked) return;
        list.removeAttribute("aria-busy");
        let note = document.getElementById("event-list-error");
        if (!note) {
          note = document.createElement("p");
          note.id = "event-list-error";
          note.className = "error";
          note.setAttribute("role", "alert");
          list.insertAdjacentElement("beforebegin", note);
        }
        note.textContent = "Could not update the list for the timeline's view: " + err.message;
      }
    }

    /* Draw the view (z0, z1) from the server. A newer view asked for while this one is on its way
     * wins: the older answer is dropped, so a double-click during a load is never lost. */
    let asked = 0;
    async function load() {
      const mine = ++asked;
      el.dataset.state = "loading";
      const u = new URL(base, window.location.origin);
      let a = later(w0, z0), b = earlier(w1, z1);
      if (a && b && new Date(b) <= new Date(a)) { a = w0; b = w1; }  // a zoom outside the search: the search
      if (a) u.searchParams.set("start", a);
      if (b) u.searchParams.set("end", b);
      try {
        const resp = await fetch(u.toString(), { headers: { Accept: "application/json" } });
        const body = await resp.json();
        if (mine !== asked) return;
        if (!resp.ok) throw new Error(body.detail || resp.statusText);
        const loading = el.querySelector(".figure-loading");
        if (loading) loading.remove();
        drawing = true;  // the relayout events Plotly.react itself sends are not the user's
        try {
          await Plotly.react(el, body.data, body.layout, { responsive: true, displaylogo: false, showSendToCloud: false });
        } finally {
          window.setTimeout(function () { drawing = false; }, 0);
        }
        const meta = body.layout.meta || {};
        el.dataset.mode = meta.mode || "";
        el.dataset.total = String(meta.total === undefined ? "" : meta.total);
        if (!bound) bind();
        if (mine === asked) el.dataset.state = "drawn";
      } catch (err) {
        if (mine !== asked) return;
        el.innerHTML = "";
        const p = document.createElement("p");
        p.className = "error";
        p.textContent = "Could not draw the timeline: " + err.message;
        el.appendChild(p);
        el.dataset.state = "error";
      }
    }

    function bind() {
      bound = true;
      el.on("plotly_relayout", function (ev) {
        if (ev["xaxis.autorange"]) {  // double-click: the whole search (a no-op when it is shown)
          if (!(z0 && z1)) return;
          z0 = z1 = null;
          keepInUrl();
          load();
          return;
        }
        if (drawing) return;
        let r0 = ev["xaxis.range[0]"], r1 = ev["xaxis.range[1]"];
        if (r0 === undefined && Array.isArray(ev["xaxis.range"])) { r0 = ev["xaxis.range"][0]; r1 = ev["xaxis.range"][1]; }
        if (r0 === undefined || r1 === undefined) return;
        zoom(axisToIso(r0), axisToIso(r1));
      });
      el.on("plotly_click", function (ev) {
        const p = ev.points && ev.points[0];
        if (!p) return;
        const cd = p.customdata;
        if (Array.isArray(cd)) zoom(cd[0], cd[1]);  // a bin: zoom into it
        else if (cd !== undefined && cd !== null) window.location.href = el.dataset.clickUrl + cd;  // an event
      });
    }

    if (z0 && z1) keepInUrl();  // a view from the URL: the page links carry it on
    if (reset) {
      reset.hidden = !(z0 && z1);
      reset.addEventListener("click", function (ev) { ev.preventDefault(); z0 = z1 = null; keepInUrl(); load(); });
    }
    load();
  }

  function checkUtc(input) {
    const v = input.value.trim();
    const ok = v === "" || ISO_UTC.test(v);
    input.classList.toggle("invalid", !ok);
    input.setAttribute("aria-invalid", ok ? "false" : "true");
    let note = input.parentElement.querySelector(".utc-error");
    if (!ok) {
      if (!note) {
        note = document.createElement("span");
        note.className = "utc-error error small";
        note.setAttribute("role", "alert");
        input.insertAdjacentElement("afterend", note);
      }
      note.textContent = JSON.stringify(v) + " is not a UTC date and time: write YYYY-MM-DDTHH:MM, e.g. 2024-05-10T06:00";
    } else if (note) {
      note.remove();
    }
    return ok;
  }

  document.addEventListener("DOMContentLoaded", function () {
    const el = document.querySelector("#timeline[data-timeline-url]");
    if (el && window.Plotly) initTimeline(el);
    const inputs = Array.from(document.querySelectorAll("input[data-utc-time]"));
    inputs.forEach(function (i) { i.addEventListener("change", function () { checkUtc(i); }); });
    const form = document.getElementById("event-filters");
    if (form && inputs.length) {
      form.addEventListener("submit", function (ev) {
        const bad = inputs.filter(function (i) { return !checkUtc(i); });
        if (bad.length) { ev.preventDefault(); bad[0].focus(); }
      });
    }
  });
})();
