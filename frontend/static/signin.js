/* The sign-in box (frontend/templates/_signin.html).
 *
 * - On load it asks GET /api/v1/session who the browser is signed in as (the cookie is
 *   HttpOnly: this script never sees it, nor the token once sent).
 * - "Sign in" posts {"token": ...} to POST /api/v1/session as application/json; the server
 *   checks the token and sets the session cookie. The answer (user, scopes, expiry) is
 *   shown as "Signed in as <user> (<scopes>)"; an error shows the API's message.
 * - "Sign out" sends DELETE /api/v1/session (the cookie is cleared; the token stays valid).
 * - Every change is announced as a "lstdp:session" event on document, detail = the
 *   session (signed_in, user, scopes, ...) and its `source`: "load" (the check on load),
 *   "unknown" (that check failed: the state is not known), "signin" or "signout" (the
 *   user's action), for other scripts of the page.
 */
(function () {
  "use strict";

  function detailText(body, fallback) {
    if (body && typeof body.detail === "string") return body.detail;
    return fallback;
  }

  async function call(url, method, payload) {
    const init = { method: method, headers: { Accept: "application/json" }, credentials: "same-origin" };
    if (payload !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(payload);
    }
    const resp = await fetch(url, init);
    const body = resp.status === 204 ? null : await resp.json().catch(function () { return null; });
    if (!resp.ok) throw new Error(detailText(body, resp.status + " " + resp.statusText));
    return body;
  }

  function show(box, session, source) {
    const form = box.querySelector("#signin-form");
    const state = box.querySelector("#signin-state");
    const signedIn = Boolean(session && session.signed_in);
    form.hidden = signedIn;
    state.hidden = !signedIn;
    box.dataset.signedIn = signedIn ? "true" : "false";
    if (signedIn) {
      box.querySelector("#signin-user").textContent = session.user;
      box.querySelector("#signin-scopes").textContent = (session.scopes || []).join(", ") || "no scopes";
      box.querySelector("#signin-expiry").textContent = session.expires_at
        ? " · token expires " + session.expires_at.replace("T", " ").replace(/(\.\d+)?(Z|\+00:00)$/, " UTC")
        : "";
    }
    const detail = Object.assign({}, session || { signed_in: false }, { source: source });
    document.dispatchEvent(new CustomEvent("lstdp:session", { detail: detail }));
  }

  function fail(box, message) {
    const err = box.querySelector("#signin-error");
    err.textContent = message;
    err.hidden = !message;
  }

  function init(box) {
    const url = box.dataset.sessionUrl;
    const form = box.querySelector("#signin-form");
    const input = box.querySelector("#signin-token");
    form.addEventListener("submit", async function (ev) {
      ev.preventDefault();
      fail(box, "");
      const button = form.querySelector("button[type=submit]");
      button.disabled = true;
      try {
        const session = await call(url, "POST", { token: input.value.trim() });
        input.value = ""; // the cookie holds it now; the page keeps no copy
        show(box, session, "signin");
      } catch (err) {
        fail(box, "Not signed in: " + err.message);
      } finally {
        button.disabled = false;
      }
    });
    box.querySelector("#signout").addEventListener("click", async function () {
      fail(box, "");
      try {
        await call(url, "DELETE");
        show(box, { signed_in: false }, "signout");
      } catch (err) {
        fail(box, "Could not sign out: " + err.message);
      }
    });
    call(url, "GET").then(function (session) { show(box, session, "load"); }, function (err) {
      show(box, { signed_in: false }, "unknown");
      fail(box, "Cannot tell whether you are signed in: " + err.message);
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    const box = document.getElementById("signin");
    if (box) init(box);
  });
})();
