/* The saved-searches page (frontend/templates/saved_searches.html).
 *
 * - "Save" posts {name, kind, query, webhook_url} to POST /api/v1/saved-searches as
 *   application/json with the session cookie; the webhook's secret, shown once in the
 *   answer, is shown on the page until it is reloaded.
 * - "Save changes" sends {name, query} to PATCH /api/v1/saved-searches/{id}; "Delete"
 *   sends DELETE (after a confirmation), both as application/json (the cookie's CSRF rule).
 * - An error shows the API's message (a 422 names the field: "query.min_angular_width: ...").
 * - Signing in or out in the sign-in box reloads the page, which then shows that user's searches.
 */
(function () {
  "use strict";

  function message(body, resp) {
    if (body && typeof body.detail === "string") return body.detail;
    if (body && Array.isArray(body.detail)) {
      return body.detail.map(function (d) { return (d.loc || []).filter(function (p) { return p !== "body"; }).join(".") +
        ": " + d.msg; }).join("; ");
    }
    return resp.status + " " + resp.statusText;
  }

  async function send(url, method, payload) {
    const resp = await fetch(url, {
      method: method, credentials: "same-origin",
      headers: { Accept: "application/json", "Content-Type": "application/json" },
      body: JSON.stringify(payload || {}),
    });
    const body = resp.status === 204 ? null : await resp.json().catch(function () { return null; });
    if (!resp.ok) throw new Error(message(body, resp));
    return body;
  }

  function showError(el, text) {
    el.textContent = text || "";
    el.hidden = !text;
  }

  document.addEventListener("DOMContentLoaded", function () {
    const root = document.getElementById("saved-searches");
    const signedIn = Boolean(root);
    document.addEventListener("lstdp:session", function (ev) {
      // only the user's own sign-in or sign-out reloads the page (a failed session check on
      // load, a 503 under load, must not: it would reload, check and fail again, forever)
      const source = ev.detail && ev.detail.source;
      if (source !== "signin" && source !== "signout") return;
      if (Boolean(ev.detail && ev.detail.signed_in) !== signedIn ||
          (root && ev.detail && ev.detail.user && ev.detail.user !== root.dataset.user)) {
        window.location.reload();
      }
    });
    if (!root) return;
    const api = root.dataset.api;

    const create = document.getElementById("saved-new");
    create.addEventListener("submit", async function (ev) {
      ev.preventDefault();
      const err = document.getElementById("saved-new-error");
      showError(err, "");
      const f = new FormData(create);
      const payload = { name: String(f.get("name")).trim(), kind: f.get("kind"), query: String(f.get("query")).trim() };
      const hook = String(f.get("webhook_url") || "").trim();
      if (hook) payload.webhook_url = hook;
      const button = document.getElementById("saved-new-submit");
      button.disabled = true;
      try {
        const saved = await send(api, "POST", payload);
        if (saved.webhook && saved.webhook.secret) {
          const box = document.getElementById("saved-new-secret");
          box.textContent = "Saved. Webhook secret (shown once, keep it to check X-LST-Signature): " + saved.webhook.secret;
          box.hidden = false;
          box.dataset.searchId = String(saved.id);
        } else {
          // to the new search in the list read again, in place of this entry of the history (Back
          // does not return to the filled form, where Save would save it twice): where only the
          // fragment changes, loading the URL would merely scroll, so the URL is replaced and the
          // page reloaded; from a prefilled form's URL (?kind=&query=) replace() loads the list
          // itself (a reload() after it would cancel that navigation and load the old URL again)
          const target = new URL("/saved-searches#saved-" + saved.id, window.location.href);
          const here = new URL(window.location.href);
          if (here.pathname === target.pathname && here.search === target.search) {
            window.history.replaceState(null, "", target.href);
            window.location.reload();
          } else {
            window.location.replace(target.href);
          }
        }
      } catch (e) {
        showError(err, "Not saved: " + e.message);
      } finally {
        button.disabled = false;
      }
    });

    root.querySelectorAll("form.saved-edit").forEach(function (form) {
      const id = form.dataset.searchId;
      const err = form.querySelector(".saved-error");
      form.addEventListener("submit", async function (ev) {
        ev.preventDefault();
        showError(err, "");
        const f = new FormData(form);
        try {
          await send(api + "/" + id, "PATCH", { name: String(f.get("name")).trim(), query: String(f.get("query")).trim() });
          window.location.reload();
        } catch (e) {
          showError(err, "Not changed: " + e.message);
        }
      });
      form.querySelector(".saved-delete").addEventListener("click", async function () {
        showError(err, "");
        if (!window.confirm("Delete this saved search, its matches and its webhook?")) return;
        try {
          await send(api + "/" + id, "DELETE");
          document.getElementById("saved-" + id).remove();
        } catch (e) {
          showError(err, "Not deleted: " + e.message);
        }
      });
    });
  });
})();
