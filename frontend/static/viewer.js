/* The L2 image viewer (/products/{id}/view): a Plotly plot on helioprojective axes.
 *
 * - GET {api}/wcs gives the pixel -> arcsec map (affine), the extent, the limb and the
 *   Stonyhurst grid (arcsec polylines, null where a line goes behind the Sun).
 * - The image is a Plotly layout image: a base PNG of the whole frame at the plot's
 *   resolution, and on every zoom or pan a PNG of the visible region at the screen's
 *   resolution from {api}/region.png (a dynamic pyramid: the server block-averages by the
 *   power of two that fits the region in `size` pixels; X-Region says which pixels came).
 * - The DQ layer is {api}/dq.png of the same region, painted onto that region's image (Plotly
 *   draws one layout image per placement: see layoutImages).
 * - Under the cursor: {api}/pixel?tx=&ty= (debounced) fills the readout.
 * - Events of the frame's window: {api}/overlays; points (rotated to DATE-OBS by the
 *   server) and CME wedges, hover text, a click opens /events/{id}. ?event=<id> (the page's
 *   data-event-id) highlights one and centres the view on it.
 * window.lstViewer exposes the state the browser tests read (requests made, last region);
 * #viewer-app's data-drawn counts the images laid out.
 */
(function () {
  "use strict";

  const root = document.getElementById("viewer-app");
  if (!root) return;
  const api = root.dataset.api;
  const plot = document.getElementById("viewer-plot");
  const errorBox = document.getElementById("viewer-error");
  const eventId = root.dataset.eventId ? Number(root.dataset.eventId) : null;
  // plotly.js 4 offers "send to Plotly Cloud" by default: the platform runs offline, its data stay here
  const PLOT_CONFIG = { responsive: true, displaylogo: false, scrollZoom: true, showSendToCloud: false };
  const TYPE_COLOURS = { FL: "#ff3b30", CE: "#34c759", PR: "#ffcc00", AR: "#5ac8fa", CH: "#af52de" };
  const state = {
    desc: null, overlays: null, requests: [], lastRegion: null, lastDecimation: null,
    base: null, detail: null, dq: null, seq: 0, hoverSeq: 0, ready: false, draws: 0,
  };
  window.lstViewer = state;

  function showError(msg) {
    errorBox.textContent = msg;
    errorBox.hidden = !msg;
  }

  async function getJSON(url) {
    const resp = await fetch(url, { headers: { Accept: "application/json" } });
    const body = await resp.json();
    if (!resp.ok) throw new Error(body.detail || resp.statusText);
    return body;
  }

  // -- geometry ----------------------------------------------------------------------------
  function toWorld(x, y) {
    const a = state.desc.affine;
    return [a.tx0 + a.m11 * x + a.m12 * y, a.ty0 + a.m21 * x + a.m22 * y];
  }
  function toPixel(tx, ty) {
    const a = state.desc.affine;
    const det = a.m11 * a.m22 - a.m12 * a.m21;
    const dx = tx - a.tx0, dy = ty - a.ty0;
    return [(a.m22 * dx - a.m12 * dy) / det, (-a.m21 * dx + a.m11 * dy) / det];
  }
  function regionOf(xr, yr) {
    const [ny, nx] = state.desc.shape;
    const pts = [toPixel(xr[0], yr[0]), toPixel(xr[1], yr[0]), toPixel(xr[0], yr[1]), toPixel(xr[1], yr[1])];
    const xs = pts.map((p) => p[0]), ys = pts.map((p) => p[1]);
    const x0 = Math.max(0, Math.floor(Math.min(...xs) + 0.5)), x1 = Math.min(nx, Math.floor(Math.max(...xs) + 0.5) + 1);
    const y0 = Math.max(0, Math.floor(Math.min(...ys) + 0.5)), y1 = Math.min(ny, Math.floor(Math.max(...ys) + 0.5) + 1);
    if (x0 >= x1 || y0 >= y1) return null;
    return { x0, x1, y0, y1 };
  }
  function placement(r) {
    const [l, b] = toWorld(r.x0 - 0.5, r.y0 - 0.5);
    const [rt, t] = toWorld(r.x1 - 0.5, r.y1 - 0.5);
    return { x: Math.min(l, rt), y: Math.max(b, t), sizex: Math.abs(rt - l), sizey: Math.abs(t - b) };
  }
  function plotSize() {
    const fl = plot._fullLayout;
    const w = fl ? fl._size.w : plot.clientWidth, h = fl ? fl._size.h : plot.clientHeight;
    return Math.max(16, Math.min(4096, Math.ceil(Math.max(w, h) * (window.devicePixelRatio || 1))));
  }
  function axisRanges() {
    const fl = plot._fullLayout;
    return [fl.xaxis.range.slice(), fl.yaxis.range.slice()];
  }

  // -- images ------------------------------------------------------------------------------
  function scaling() {
    return {
      stretch: document.getElementById("viewer-stretch").value,
      pmin: document.getElementById("viewer-pmin").value,
      pmax: document.getElementById("viewer-pmax").value,
    };
  }

  async function fetchPng(kind, r, size) {
    const q = new URLSearchParams({ x0: r.x0, x1: r.x1, y0: r.y0, y1: r.y1, size: size });
    if (kind === "region") {
      const s = scaling();
      q.set("stretch", s.stretch); q.set("pmin", s.pmin); q.set("pmax", s.pmax);
    }
    const url = `${api}/${kind}.png?${q}`;
    const resp = await fetch(url);
    if (!resp.ok) {
      let detail = resp.statusText;
      try { detail = (await resp.json()).detail || detail; } catch (e) { /* not JSON */ }
      throw new Error(detail);
    }
    const got = resp.headers.get("X-Region").split(",").map(Number);
    const region = { x0: got[0], x1: got[1], y0: got[2], y1: got[3] };
    const factor = Number(resp.headers.get("X-Decimation"));
    const limits = resp.headers.get("X-Display-Limits");
    const blob = await resp.blob();
    const entry = { kind, url, region, factor, size, limits };
    state.requests.push(entry);
    return { src: URL.createObjectURL(blob), region, factor, limits };
  }

  function sameRegion(a, b) {
    return a.x0 === b.x0 && a.x1 === b.x1 && a.y0 === b.y0 && a.y1 === b.y1;
  }

  function layoutImage(src, region) {
    const p = placement(region);
    return { source: src, xref: "x", yref: "y", x: p.x, y: p.y, sizex: p.sizex, sizey: p.sizey,
             xanchor: "left", yanchor: "top", sizing: "stretch", layer: "below" };
  }

  // Plotly keys layout images by their placement (xref, x, sizex, yref, y, sizey) and drops an
  // image placed exactly like another, so a DQ layer of the region shown (always the case: it is
  // asked for that region) is painted onto that region's image instead: one image per placement,
  // under the traces. A DQ layer of another region is an image of its own.
  function layoutImages() {
    const dq = document.getElementById("viewer-dq").checked ? state.dq : null;
    const imgs = [];
    let painted = false;
    for (const layer of [state.base, state.detail]) {
      if (!layer) continue;
      const onto = dq && dq.painted && dq.onto === layer;
      painted = painted || onto;
      imgs.push(layoutImage(onto ? dq.painted : layer.src, layer.region));
    }
    if (dq && !painted) imgs.push(layoutImage(dq.src, dq.region));
    root.dataset.dq = dq ? (painted ? "painted" : "separate") : "";
    return imgs;
  }

  async function decoded(src) {
    const im = new Image();
    im.src = src;
    await im.decode();
    return im;
  }

  // The image of `layer` with the DQ PNG drawn over it (same region: same pixel grid), as a PNG URL.
  async function paintDq(layer, dq) {
    const [image, mask] = await Promise.all([decoded(layer.src), decoded(dq.src)]);
    const canvas = document.createElement("canvas");
    canvas.width = image.naturalWidth;
    canvas.height = image.naturalHeight;
    const g = canvas.getContext("2d");
    g.imageSmoothingEnabled = false;
    g.drawImage(image, 0, 0);
    g.drawImage(mask, 0, 0, canvas.width, canvas.height);
    const blob = await new Promise((resolve) => canvas.toBlob(resolve, "image/png"));
    return URL.createObjectURL(blob);
  }

  function replace(key, value) {
    const old = state[key];
    if (old && old.src) URL.revokeObjectURL(old.src);
    if (old && old.painted) URL.revokeObjectURL(old.painted);
    state[key] = value;
  }

  async function refresh(full) {
    const seq = ++state.seq;
    const [ny, nx] = state.desc.shape;
    const size = plotSize();
    try {
      if (full || !state.base) {
        const b = await fetchPng("region", { x0: 0, x1: nx, y0: 0, y1: ny }, size);
        if (seq !== state.seq) { URL.revokeObjectURL(b.src); return; }
        replace("base", b);
        document.getElementById("fr-limits").textContent = b.limits ? b.limits.replace(",", " … ") + " " + state.desc.bunit : "—";
      }
      const [xr, yr] = axisRanges();
      const r = regionOf(xr, yr);
      let detail = null, dq = null;
      if (r && !(r.x0 === 0 && r.y0 === 0 && r.x1 === nx && r.y1 === ny)) {
        detail = await fetchPng("region", r, size);
      }
      if (r && document.getElementById("viewer-dq").checked) dq = await fetchPng("dq", r, size);
      if (dq) {
        dq.onto = [detail, state.base].find((layer) => layer && sameRegion(layer.region, dq.region)) || null;
        if (dq.onto) dq.painted = await paintDq(dq.onto, dq);
      }
      if (seq !== state.seq) {
        for (const x of [detail, dq]) if (x) URL.revokeObjectURL(x.src);
        if (dq && dq.painted) URL.revokeObjectURL(dq.painted);
        return;
      }
      replace("detail", detail);
      replace("dq", dq);
      const shown = detail || state.base;
      state.lastRegion = shown.region;
      state.lastDecimation = shown.factor;
      root.dataset.region = [shown.region.x0, shown.region.x1, shown.region.y0, shown.region.y1].join(",");
      root.dataset.decimation = String(shown.factor);
      document.getElementById("fr-region").textContent =
        `x ${shown.region.x0}–${shown.region.x1}, y ${shown.region.y0}–${shown.region.y1} at 1:${shown.factor}`;
      await Plotly.relayout(plot, { images: layoutImages() });
      showError("");
      root.dataset.loaded = String(state.requests.length);
      root.dataset.drawn = String(++state.draws);
    } catch (err) {
      showError("Could not draw the image: " + err.message);
    }
  }

  let relayoutTimer = null;
  function onRelayout(ev) {
    if (!state.ready || !ev) return;
    const keys = Object.keys(ev);
    if (!keys.some((k) => k.startsWith("xaxis") || k.startsWith("yaxis"))) return;
    window.clearTimeout(relayoutTimer);
    relayoutTimer = window.setTimeout(() => refresh(false), 150);
  }

  // -- traces ------------------------------------------------------------------------------
  function gridTraces() {
    const d = state.desc;
    const join = (lines) => {
      const x = [], y = [];
      for (const l of lines) { x.push(...l.x, null); y.push(...l.y, null); }
      return { x, y };
    };
    const lat = join(d.grid.lat), lon = join(d.grid.lon);
    const base = { type: "scatter", mode: "lines", hoverinfo: "skip", showlegend: false };
    return [
      { ...base, name: "grid-lat", x: lat.x, y: lat.y, line: { color: "rgba(255,255,255,0.45)", width: 1 } },
      { ...base, name: "grid-lon", x: lon.x, y: lon.y, line: { color: "rgba(255,255,255,0.45)", width: 1 } },
      { ...base, name: "limb", x: d.limb.x, y: d.limb.y, line: { color: "rgba(255,255,255,0.9)", width: 1.5 } },
    ];
  }

  function hover(e) {
    return `${e.label}<br>${e.note || ""}`;
  }

  function eventTraces() {
    const traces = [];
    const evs = state.overlays ? state.overlays.events : [];
    const points = evs.filter((e) => e.kind === "point" && e.id !== eventId);
    if (points.length) {
      traces.push({
        type: "scatter", mode: "markers", name: "events",
        x: points.map((e) => e.hpc_x), y: points.map((e) => e.hpc_y),
        customdata: points.map((e) => e.url), hovertext: points.map(hover), hoverinfo: "text",
        marker: { size: 14, symbol: points.map((e) => (e.visible === false ? "circle-open-dot" : "circle-open")),
                  color: points.map((e) => (e.visible === false ? "#bbbbbb" : TYPE_COLOURS[e.type] || "#ffffff")),
                  line: { width: 2 } },
        showlegend: false,
      });
    }
    for (const e of evs.filter((x) => x.kind === "wedge")) {
      const c = TYPE_COLOURS[e.type] || "#34c759";
      traces.push({
        type: "scatter", mode: "lines", name: `wedge-${e.id}`, x: e.x, y: e.y, fill: "toself",
        fillcolor: e.id === eventId ? "rgba(52,199,89,0.35)" : "rgba(52,199,89,0.18)",
        line: { color: c, width: e.id === eventId ? 2.5 : 1.2 }, hoveron: "fills+points",
        text: hover(e), hoverinfo: "text", customdata: e.x.map(() => e.url), showlegend: false,
      });
    }
    const hl = evs.find((e) => e.id === eventId && e.kind === "point");
    if (hl) {
      traces.push({
        type: "scatter", mode: "markers", name: "highlight", x: [hl.hpc_x], y: [hl.hpc_y],
        customdata: [hl.url], hovertext: [hover(hl)], hoverinfo: "text",
        marker: { size: 22, symbol: hl.visible === false ? "circle-open-dot" : "circle-open",
                  color: "#00e5ff", line: { width: 3 } },
        showlegend: false,
      });
    }
    return traces;
  }

  function traces() {
    const t = [];
    if (document.getElementById("viewer-grid").checked) t.push(...gridTraces());
    if (document.getElementById("viewer-events").checked) t.push(...eventTraces());
    // an invisible trace spanning the frame keeps autorange on the image when the rest is off
    const e = state.desc.extent;
    t.push({ type: "scatter", mode: "markers", name: "frame", x: e.tx, y: e.ty, hoverinfo: "skip",
             marker: { opacity: 0 }, showlegend: false });
    return t;
  }

  function listEvents() {
    const ul = document.getElementById("viewer-event-list");
    ul.innerHTML = "";
    const evs = state.overlays.events;
    if (!evs.length) {
      const li = document.createElement("li");
      li.className = "muted";
      li.textContent = "No event in this window.";
      ul.appendChild(li);
    }
    for (const e of evs) {
      const li = document.createElement("li");
      li.dataset.eventId = e.id;
      if (e.id === eventId) li.className = "highlight";
      const a = document.createElement("a");
      a.href = e.url;
      a.textContent = e.label;
      li.appendChild(a);
      const note = document.createElement("span");
      note.className = "muted";
      note.textContent = ` — ${e.kind === "none" ? "" : e.kind + ": "}${e.note}`;
      li.appendChild(note);
      ul.appendChild(li);
    }
  }

  // -- readout -----------------------------------------------------------------------------
  const fmt = (v, d) => (v === null || v === undefined ? "—" : Number(v).toFixed(d));
  let hoverTimer = null;
  function onMouseMove(ev) {
    if (!state.ready) return;
    const drag = plot.querySelector(".nsewdrag");
    if (!drag) return;
    const rect = drag.getBoundingClientRect();
    const fx = (ev.clientX - rect.left) / rect.width, fy = (ev.clientY - rect.top) / rect.height;
    if (fx < 0 || fx > 1 || fy < 0 || fy > 1) return;
    const [xr, yr] = axisRanges();
    const tx = xr[0] + fx * (xr[1] - xr[0]), ty = yr[1] - fy * (yr[1] - yr[0]);
    window.clearTimeout(hoverTimer);
    hoverTimer = window.setTimeout(() => readout(tx, ty), 80);
  }

  async function readout(tx, ty) {
    const seq = ++state.hoverSeq;
    const [x, y] = toPixel(tx, ty);
    const [ny, nx] = state.desc.shape;
    if (x < -0.5 || y < -0.5 || x >= nx - 0.5 || y >= ny - 0.5) {
      document.getElementById("ro-pixel").textContent = "outside the image";
      return;
    }
    try {
      const p = await getJSON(`${api}/pixel?tx=${tx.toFixed(3)}&ty=${ty.toFixed(3)}`);
      if (seq !== state.hoverSeq) return;
      document.getElementById("ro-pixel").textContent = `${p.x}, ${p.y}`;
      document.getElementById("ro-hpc").textContent = `${fmt(p.tx, 1)}″, ${fmt(p.ty, 1)}″`;
      document.getElementById("ro-hgs").textContent = p.on_disk ? `${fmt(p.hgs_lat, 2)}°, ${fmt(p.hgs_lon, 2)}°` : "off the disk";
      document.getElementById("ro-r").textContent = `${fmt(p.r_rsun, 3)} Rsun`;
      document.getElementById("ro-value").textContent = p.value === null ? "NaN" : `${Number(p.value).toPrecision(5)} ${p.bunit}`;
      document.getElementById("ro-dq").textContent = p.dq ? `${p.dq} (${p.dq_flags.join(", ")})` : "0 (good)";
      root.dataset.readout = JSON.stringify(p);
    } catch (err) {
      document.getElementById("ro-pixel").textContent = err.message;
    }
  }

  // -- set up ------------------------------------------------------------------------------
  function initialRanges() {
    const e = state.desc.extent;
    const hl = state.overlays && state.overlays.events.find((x) => x.id === eventId && x.kind === "point");
    if (!hl) return [e.tx.slice(), e.ty.slice()];
    const half = Math.max(Math.abs(e.tx[1] - e.tx[0]), Math.abs(e.ty[1] - e.ty[0])) / 6;
    return [[hl.hpc_x - half, hl.hpc_x + half], [hl.hpc_y - half, hl.hpc_y + half]];
  }

  async function redrawTraces() {
    const [xr, yr] = axisRanges();
    await Plotly.react(plot, traces(), { ...plot.layout, xaxis: { ...plot.layout.xaxis, range: xr, autorange: false },
                                          yaxis: { ...plot.layout.yaxis, range: yr, autorange: false } },
                      PLOT_CONFIG);
  }

  async function init() {
    try {
      const q = eventId ? `?event=${eventId}` : "";
      const [desc, overlays] = await Promise.all([getJSON(`${api}/wcs`), getJSON(`${api}/overlays${q}`)]);
      state.desc = desc;
      state.overlays = overlays;
    } catch (err) {
      plot.innerHTML = "";
      showError("Could not load the product: " + err.message);
      return;
    }
    const d = state.desc;
    document.getElementById("fr-date").textContent = d.date_obs + " UTC";
    document.getElementById("fr-observer").textContent =
      `Stonyhurst lon ${d.observer.lon_deg.toFixed(2)}°, lat ${d.observer.lat_deg.toFixed(2)}°, ${(d.observer.distance_m / 1.495978707e11).toFixed(5)} au`;
    document.getElementById("fr-rsun").textContent = `${d.rsun_arcsec.toFixed(1)}″`;
    listEvents();
    const legend = document.getElementById("viewer-dq-legend");
    for (const b of d.dq_bits) {
      const li = document.createElement("li");
      const sw = document.createElement("span");
      sw.className = "swatch";
      sw.style.background = b.colour;
      li.appendChild(sw);
      li.appendChild(document.createTextNode(` ${b.value} ${b.name}`));
      legend.appendChild(li);
    }
    const [xr, yr] = initialRanges();
    const layout = {
      margin: { l: 70, r: 20, t: 36, b: 60 },
      paper_bgcolor: "#ffffff", plot_bgcolor: "#000000",
      xaxis: { title: { text: "Helioprojective Tx [arcsec]" }, range: xr, autorange: false, zeroline: false,
               showgrid: false, ticks: "outside" },
      yaxis: { title: { text: "Helioprojective Ty [arcsec]" }, range: yr, autorange: false, zeroline: false,
               showgrid: false, ticks: "outside", scaleanchor: "x", scaleratio: 1 },
      dragmode: "zoom", hovermode: "closest", showlegend: false,
    };
    plot.innerHTML = "";
    await Plotly.newPlot(plot, traces(), layout, PLOT_CONFIG);
    plot.on("plotly_relayout", onRelayout);
    plot.on("plotly_click", (ev) => {
      const url = ev.points && ev.points[0] && ev.points[0].customdata;
      if (typeof url === "string" && url.startsWith("/events/")) window.location.href = url;
    });
    plot.addEventListener("mousemove", onMouseMove);
    await refresh(true);
    state.ready = true;
    root.dataset.ready = "1";
  }

  for (const id of ["viewer-stretch", "viewer-pmin", "viewer-pmax"]) {
    document.getElementById(id).addEventListener("change", () => { if (state.ready) refresh(true); });
  }
  document.getElementById("viewer-dq").addEventListener("change", () => { if (state.ready) refresh(false); });
  for (const id of ["viewer-grid", "viewer-events"]) {
    document.getElementById(id).addEventListener("change", async () => {
      if (!state.ready) return;
      await redrawTraces();
      await Plotly.relayout(plot, { images: layoutImages() });
    });
  }
  document.getElementById("viewer-reset").addEventListener("click", () => {
    if (!state.ready) return;
    const e = state.desc.extent;
    Plotly.relayout(plot, { "xaxis.range": e.tx.slice(), "yaxis.range": e.ty.slice() });
  });
  init();
})();
