/* Bulk download form of the products page (frontend/templates/_products_download.html).
 *
 * Submitting opens the archive (or the script, the button's formaction) with the non-empty
 * fields only (an empty time is no filter, not a bad time); times without an offset are UTC.
 * As the fields change, #bulk-count says how many products match (GET /api/v1/products,
 * limit=1: its total) and whether that is over the archive's limit.
 */
(function () {
  "use strict";

  const OFFSET = /(Z|[+-]\d{2}:?\d{2})$/i;
  const TIMES = new Set(["start", "end"]);

  function query(form, withFormat) {
    const q = new URLSearchParams();
    for (const [key, value] of new FormData(form).entries()) {
      let v = String(value).trim();
      if (v === "" || (key === "format" && !withFormat)) continue;
      if (TIMES.has(key) && !OFFSET.test(v)) v += "Z";
      q.append(key, v);
    }
    return q;
  }

  function init(form) {
    const out = document.getElementById("bulk-count");
    const limit = Number(form.dataset.limit);
    let timer = null;
    let asked = 0;

    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      const button = ev.submitter;
      const action = (button && button.getAttribute("formaction")) || form.getAttribute("action");
      const isScript = action.endsWith(".sh");
      const q = query(form, !isScript);
      window.location.assign(action + (q.toString() ? "?" + q : ""));
    });

    async function count() {
      const q = query(form, false);
      if (q.get("state") === "any") q.delete("state");
      q.set("limit", "1");
      const mine = ++asked;
      try {
        const resp = await fetch(form.dataset.countUrl + "?" + q, { headers: { Accept: "application/json" } });
        const body = await resp.json();
        if (mine !== asked) return;
        if (!resp.ok) throw new Error(typeof body.detail === "string" ? body.detail : resp.statusText);
        out.textContent = body.total + " product" + (body.total === 1 ? "" : "s") + " match" +
          (body.total === 1 ? "es" : "") + (body.total > limit ? ": more than the " + limit + " an archive holds, " +
          "narrow the search" : "") + ".";
        out.className = "small" + (body.total > limit ? " error" : "");
        out.dataset.total = String(body.total);
      } catch (err) {
        if (mine !== asked) return;
        out.textContent = "Cannot count the products: " + err.message;
        out.className = "small error";
      }
    }
    form.addEventListener("input", function () {
      window.clearTimeout(timer);
      timer = window.setTimeout(count, 250);
    });
    form.addEventListener("change", function () {
      window.clearTimeout(timer);
      timer = window.setTimeout(count, 50);
    });
    count();
  }

  document.addEventListener("DOMContentLoaded", function () {
    const form = document.getElementById("bulk-form");
    if (form) init(form);
  });
})();
