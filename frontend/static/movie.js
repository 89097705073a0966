// The frame player (templates/_movie_player.html): play/pause, step, speed, a time slider,
// the DATE-OBS of the frame shown, the window's events listed once the frames reach their
// start (and marked where they are while they last), and "Make MP4" with its progress (shown
// only to a browser signed in with scope jobs:submit, GET /api/v1/session).
// Frames and markers come from GET /api/v1/movies/frames (markers placed server-side
// through each product's WCS, as fractions of the image from the top left).
// A frame whose image fails to load is marked (a red outline and a note on the stage, and
// in the list under the controls) and tried again, at most MAX_RETRIES times, each after a
// longer pause, with a fresh URL (?retry=n) so that no failed answer is reused.
(function () {
  "use strict";

  const MAX_RETRIES = 3;   // tries after the first failure of a frame, each time it is shown
  const RETRY_MS = 700;    // pause before try n: n * RETRY_MS

  function fmt(iso) {
    // "2004-03-01T00:00:10.515000Z" -> "2004-03-01 00:00:10.515 UTC"
    return iso ? iso.replace("T", " ").replace("Z", "").slice(0, 23) + " UTC" : "—";
  }

  function ms(iso) { return iso ? Date.parse(iso) : NaN; }

  function eventLabel(e) {
    let s = e.event_type + " #" + e.id;
    if (e.goes_class) s += " GOES " + e.goes_class;
    return s;
  }

  function el(tag, attrs, text) {
    const n = document.createElement(tag);
    Object.entries(attrs || {}).forEach(([k, v]) => n.setAttribute(k, v));
    if (text !== undefined) n.textContent = text;
    return n;
  }

  function withRetry(url, n) {
    return n ? url + (url.indexOf("?") >= 0 ? "&" : "?") + "retry=" + n : url;
  }

  function Player(root) {
    const $ = (id) => root.querySelector("#" + id);
    const img = $("movie-frame"), slider = $("movie-slider"), playBtn = $("movie-play");
    const stage = $("movie-stage"), frameError = $("movie-frame-error"), failedNote = $("movie-failed");
    const dateObs = $("movie-date-obs"), index = $("movie-index"), markers = $("movie-markers");
    const list = $("movie-events"), noEvents = $("movie-no-events"), speed = $("movie-speed");
    let data = null, i = 0, timer = null, retryTimer = null;
    const cache = [];
    // frame index -> {tries: retries made, state: "failed" (a preload failed: tried again when
    // shown) | "retrying" | "gave-up" | "loaded"}
    const failed = {};

    function preload(k) {
      if (!data || k < 0 || k >= data.frames.length || cache[k]) return;
      const im = new Image();
      im.onerror = () => {  // shown later with a fresh URL, and marked
        delete cache[k];
        if (!failed[k]) failed[k] = {tries: 1, state: "failed"};
        showFailures();
      };
      im.src = withRetry(data.frames[k].url, failed[k] ? failed[k].tries : 0);
      cache[k] = im;
    }

    function showFailures() {
      const f = failed[i];
      const bad = !!f && f.state !== "loaded";
      stage.classList.toggle("frame-failed", bad);
      frameError.hidden = !bad;
      if (bad) {
        frameError.textContent = f.state === "gave-up"
          ? "Frame " + (i + 1) + " could not be loaded (" + (f.tries + 1) + " tries)."
          : "Frame " + (i + 1) + " failed to load: trying again (" + f.tries + " of " + MAX_RETRIES + ")…";
      }
      const ks = Object.keys(failed).map(Number).sort((a, b) => a - b);
      root.dataset.failedFrames = ks.filter((k) => failed[k].state !== "loaded").map((k) => k + 1).join(",");
      failedNote.hidden = !ks.length;
      failedNote.textContent = ks.length ? "Frames that failed to load: " + ks.map((k) => (k + 1) + " (" +
        {failed: "failed, tried again when shown", retrying: "retrying", "gave-up": "could not be loaded",
         loaded: "loaded on a retry"}[failed[k].state] +
        ")").join(", ") : "";
    }

    img.addEventListener("error", () => {
      const k = Number(img.dataset.frame);
      if (!data || k !== i) return;
      const f = failed[k] || (failed[k] = {tries: 0, state: "retrying"});
      delete cache[k];
      if (f.tries >= MAX_RETRIES) {
        f.state = "gave-up";
      } else {
        f.state = "retrying";
        f.tries += 1;
        const n = f.tries;
        clearTimeout(retryTimer);
        retryTimer = setTimeout(() => { if (i === k) img.src = withRetry(data.frames[k].url, n); }, RETRY_MS * n);
      }
      showFailures();
    });
    img.addEventListener("load", () => {
      const k = Number(img.dataset.frame);
      if (k === i && failed[k] && failed[k].state !== "loaded") failed[k].state = "loaded";
      showFailures();
    });

    function lastOf(e) { return ms(e.end_time || e.peak_time || e.start_time); }

    function show(k) {
      if (!data || !data.frames.length) return;
      i = Math.max(0, Math.min(data.frames.length - 1, k));
      const f = data.frames[i];
      const fail = failed[i];
      if (fail && fail.state === "gave-up") fail.tries = 0;  // shown again: a fresh round of tries
      if (fail && fail.state !== "loaded") fail.state = "retrying";
      clearTimeout(retryTimer);
      img.dataset.frame = String(i);
      img.src = withRetry(f.url, fail && fail.state !== "loaded" ? fail.tries : 0);
      img.dataset.productId = f.product_id;
      showFailures();
      slider.value = String(i);
      dateObs.textContent = fmt(f.date_obs);
      dateObs.dataset.iso = f.date_obs;
      index.textContent = (i + 1) + " / " + data.frames.length;
      const t = ms(f.date_obs);
      let started = 0;
      list.querySelectorAll("li").forEach((li) => {
        const e = data.byId[li.dataset.eventId];
        const on = ms(e.start_time) <= t;
        li.hidden = !on;
        li.classList.toggle("current", on && t <= lastOf(e));
        if (on) started += 1;
      });
      noEvents.hidden = started > 0 || !data.events.length;
      markers.textContent = "";
      Object.entries(f.markers || {}).forEach(([id, xy]) => {
        const e = data.byId[id];
        if (!e || ms(e.start_time) > t || t > lastOf(e)) return;
        const m = el("a", {class: "movie-marker type-" + e.event_type, href: e.url, title: eventLabel(e),
                           "data-event-id": id});
        m.style.left = (xy[0] * 100).toFixed(3) + "%";
        m.style.top = (xy[1] * 100).toFixed(3) + "%";
        m.appendChild(el("span", {}, eventLabel(e)));
        markers.appendChild(m);
      });
      for (let n = 1; n <= 5; n++) preload(i + n);
    }

    function stop() {
      if (timer) clearInterval(timer);
      timer = null;
      playBtn.textContent = "Play";
      root.dataset.playing = "false";
    }

    function play() {
      if (!data || data.frames.length < 2) return;
      if (i >= data.frames.length - 1) show(0);
      stop();
      playBtn.textContent = "Pause";
      root.dataset.playing = "true";
      timer = setInterval(() => {
        if (i >= data.frames.length - 1) { stop(); return; }
        show(i + 1);
      }, 1000 / Number(speed.value || 5));
    }

    playBtn.addEventListener("click", () => (timer ? stop() : play()));
    $("movie-back").addEventListener("click", () => { stop(); show(i - 1); });
    $("movie-forward").addEventListener("click", () => { stop(); show(i + 1); });
    slider.addEventListener("input", () => { stop(); show(Number(slider.value)); });
    speed.addEventListener("change", () => { if (timer) play(); });

    function makeMovie() {
      const btn = $("movie-make"), status = $("movie-status"), bar = $("movie-progress"), link = $("movie-download");
      btn.disabled = true;
      link.hidden = true;
      status.textContent = "Sending…";
      const body = {channel: data.channel, start: data.start, end: data.end, diff: data.diff,
                    fps: Number($("movie-fps").value || 10)};
      if ($("movie-size").value) body.size = Number($("movie-size").value);
      if (data.event && ($("movie-mark").checked || $("movie-crop").checked)) {
        body.event = data.event;
        body.crop = $("movie-crop").checked;
      }
      fetch("/api/v1/movies", {method: "POST", headers: {"Content-Type": "application/json"},
                               body: JSON.stringify(body)})
        .then((r) => r.json().then((j) => ({ok: r.ok, j: j})))
        .then(({ok, j}) => {
          if (!ok) { status.textContent = j.detail || "refused"; btn.disabled = false; return; }
          root.dataset.movieId = j.id;
          bar.hidden = false;
          follow(j.id);
        })
        .catch((err) => { status.textContent = "could not send: " + err; btn.disabled = false; });

      function follow(id) {
        fetch("/api/v1/movies/" + id).then((r) => r.json()).then((m) => {
          bar.value = m.progress || 0;
          status.textContent = m.state + ": " + m.frames_done + " of " + m.frames_total + " frames";
          status.className = "small job-state state-" + m.state;
          if (m.state === "succeeded") {
            link.href = m.file_url;
            link.hidden = false;
            btn.disabled = false;
            status.textContent += " · " + (m.size_bytes / 1024).toFixed(0) + " KiB, " + m.width + "×" + m.height;
          } else if (m.state === "failed") {
            status.textContent += " · " + (m.error || "failed");
            btn.disabled = false;
          } else {
            setTimeout(() => follow(id), 500);
          }
        }).catch(() => setTimeout(() => follow(id), 1500));
      }
    }
    $("movie-make").addEventListener("click", makeMovie);

    // "Make MP4" is a job of the signed-in user (scope jobs:submit; admin implies it): shown only
    // then, otherwise a note says how to sign in (an anonymous click could only be refused)
    fetch("/api/v1/session", {headers: {Accept: "application/json"}, credentials: "same-origin"})
      .then((r) => (r.ok ? r.json() : {signed_in: false}))
      .catch(() => ({signed_in: false}))
      .then((s) => {
        const scopes = (s && s.scopes) || [];
        const may = Boolean(s && s.signed_in) && (scopes.includes("jobs:submit") || scopes.includes("admin"));
        $("movie-make-box").hidden = !may;
        $("movie-make-signin").hidden = may;
        root.dataset.canMake = may ? "true" : "false";
      });

    fetch(root.dataset.framesUrl).then((r) => r.json().then((j) => ({ok: r.ok, j: j}))).then(({ok, j}) => {
      const loading = $("movie-loading");
      if (!ok) { loading.textContent = j.detail || "could not load the frames"; loading.className = "error"; return; }
      data = j;
      data.byId = {};
      data.events.forEach((e) => { data.byId[String(e.id)] = e; });
      list.textContent = "";
      data.events.forEach((e) => {
        const li = el("li", {"data-event-id": String(e.id)});
        li.hidden = true;
        li.appendChild(el("span", {class: "badge type-" + e.event_type}, e.event_type));
        li.appendChild(document.createTextNode(" "));
        li.appendChild(el("a", {href: e.url}, eventLabel(e)));
        li.appendChild(document.createTextNode(" · " + fmt(e.start_time) + " · " + e.source));
        list.appendChild(li);
      });
      if (!data.frames.length) {
        loading.textContent = "No written L2 product of " + data.channel + " in this window" +
          (data.diff !== "none" ? " (a difference needs two frames)" : "") + ".";
        root.classList.add("empty");
        return;
      }
      loading.hidden = true;
      $("movie-event-options").hidden = !data.event;
      root.classList.add("ready");
      slider.max = String(data.frames.length - 1);
      show(0);
      root.dataset.ready = "true";
    });
  }

  document.querySelectorAll(".movie-player").forEach((root) => Player(root));
})();
