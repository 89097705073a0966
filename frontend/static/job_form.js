/* The recalibration job form (frontend/templates/job_new.html).
 *
 * - The DATE-OBS fields are UTC text (ISO 8601): a time without an offset gets "Z".
 * - The calibration options (inputs named opt:<name>, data-kind bool/int/float/choice) go to
 *   the job's "options"; the pinned versions (selects named pin:<kind>, "" = newest valid) to
 *   "pinned_calibrations".
 * - A pinned version is offered only while a chosen channel has it.
 * - The estimate (#job-estimate) asks GET /api/v1/jobs/estimate as the channels and times
 *   change (debounced), and says how many frames the job would recalibrate.
 * - Submitting posts the job with fetch (as application/json, with the session cookie of the
 *   sign-in box, signin.js: the job's owner is the token's user) and follows it with app.js's
 *   job status; an error shows the API's message (401 when not signed in, 403 without the scope).
 */
(function () {
  "use strict";

  const OFFSET = /(Z|[+-]\d{2}:?\d{2})$/i;
  const ESTIMATE_DELAY_MS = 250;

  function utcText(value) {
    const v = String(value || "").trim();
    return v === "" || OFFSET.test(v) ? v : v + "Z";
  }

  function readOptions(form) {
    const options = {};
    form.querySelectorAll("[name^='opt:']").forEach(function (el) {
      const name = el.name.slice(4);
      const kind = el.dataset.kind;
      if (kind === "bool") options[name] = el.checked;
      else if (kind === "int") options[name] = parseInt(el.value, 10);
      else if (kind === "float") options[name] = Number(el.value);
      else options[name] = el.value;
    });
    return options;
  }

  function readPins(form) {
    const pinned = {};
    form.querySelectorAll("select[name^='pin:']").forEach(function (el) {
      if (el.value !== "") pinned[el.name.slice(4)] = Number(el.value);
    });
    return pinned;
  }

  function detailText(body, fallback) {
    if (body && typeof body.detail === "string") return body.detail;
    if (body && Array.isArray(body.detail)) return body.detail.map(function (d) { return d.msg; }).join("; ");
    return fallback;
  }

  function initEstimate(form) {
    const out = document.getElementById("job-estimate");
    let timer = null;
    let asked = 0;
    async function estimate() {
      const data = new FormData(form);
      const channels = data.getAll("channels");
      if (channels.length === 0) {
        out.textContent = "Choose at least one channel.";
        out.className = "estimate error";
        return;
      }
      const q = new URLSearchParams();
      channels.forEach(function (c) { q.append("channels", c); });
      q.set("start", utcText(data.get("start")));
      q.set("end", utcText(data.get("end")));
      const mine = ++asked;
      try {
        const resp = await fetch(form.dataset.estimateUrl + "?" + q, { headers: { Accept: "application/json" } });
        const body = await resp.json();
        if (mine !== asked) return; // a newer question is on its way
        if (!resp.ok) throw new Error(detailText(body, resp.statusText));
        const per = Object.entries(body.per_channel).map(function (kv) { return kv[0] + " " + kv[1]; }).join(", ");
        out.textContent = "This job would recalibrate " + body.frames + " frame" + (body.frames === 1 ? "" : "s") +
          " (" + per + ")" + (body.with_products ? "; " + body.with_products + " of them already have a product" : "") +
          ".";
        out.className = "estimate" + (body.frames === 0 ? " warn" : "");
        out.dataset.frames = String(body.frames);
      } catch (err) {
        if (mine !== asked) return;
        out.textContent = "Cannot estimate: " + err.message;
        out.className = "estimate error";
        delete out.dataset.frames;
      }
    }
    function soon() {
      window.clearTimeout(timer);
      timer = window.setTimeout(estimate, ESTIMATE_DELAY_MS);
    }
    form.querySelectorAll("input[name=channels], #job-start, #job-end").forEach(function (el) {
      el.addEventListener("input", soon);
      el.addEventListener("change", soon);
    });
    estimate();
  }

  // A pinned version that none of the chosen channels has cannot be asked for: disabled
  // (and unselected) until such a channel is chosen again.
  function syncPins(form) {
    const chosen = new Set(new FormData(form).getAll("channels"));
    form.querySelectorAll("select[name^='pin:'] option[data-channels]").forEach(function (opt) {
      const has = opt.dataset.channels.split(",").some(function (c) { return chosen.has(c); });
      opt.disabled = !has;
      if (!has && opt.selected) opt.parentElement.value = "";
    });
  }

  function initJobForm(form) {
    form.querySelectorAll("input[name=channels]").forEach(function (el) {
      el.addEventListener("change", function () { syncPins(form); });
    });
    syncPins(form);
    const errorBox = document.getElementById("job-form-error");
    const follow = document.getElementById("job-follow");
    const template = document.getElementById("job-status-template");
    form.addEventListener("submit", async function (ev) {
      ev.preventDefault();
      errorBox.hidden = true;
      const data = new FormData(form);
      const payload = {
        channels: data.getAll("channels"),
        start: utcText(data.get("start")),
        end: utcText(data.get("end")),
        pinned_calibrations: readPins(form),
        options: readOptions(form),
      };
      const button = form.querySelector("button[type=submit]");
      button.disabled = true;
      try {
        const resp = await fetch(form.action, {
          method: "POST",
          credentials: "same-origin",
          headers: { "Content-Type": "application/json", Accept: "application/json" },
          body: JSON.stringify(payload),
        });
        const body = await resp.json();
        if (!resp.ok) throw new Error(detailText(body, resp.statusText));
        const html = template.innerHTML.replaceAll("JOB_ID", body.id);
        follow.insertAdjacentHTML("afterbegin", html);
        const el = follow.querySelector(".job-status");
        window.LSTDP.updateJobStatus(el, body);
        window.LSTDP.followJob(el);
      } catch (err) {
        errorBox.textContent = err.message;
        errorBox.hidden = false;
      } finally {
        button.disabled = false;
      }
    });
    initEstimate(form);
  }

  document.addEventListener("DOMContentLoaded", function () {
    const form = document.getElementById("job-form");
    if (form) initJobForm(form);
  });
})();
