/* Cancel and Retry buttons of the job page (frontend/templates/_job_actions.html).
 *
 * POST /api/v1/jobs/{id}/cancel or /retry with the browser's credentials (the session
 * cookie made from a pasted token, `credentials: "same-origin"`), as application/json with an
 * empty JSON object: the cookie's CSRF rule refuses (403) a write sent as anything else. The API's answer is shown
 * as it is: 401 (no token: paste one), 403 (another user's job, or a missing scope), 409 (the
 * job's state does not allow it), each with its message. The buttons follow the job's state
 * as the progress poll (app.js) updates `.job-status[data-state]`.
 */
(function () {
  "use strict";

  function show(box, text, isError) {
    const msg = box.querySelector(".job-action-message");
    msg.textContent = text;
    msg.className = "job-action-message" + (isError ? " error" : "");
    msg.hidden = false;
    box.hidden = false;
  }

  /* The card is shown while any of its parts is (a button that applies, a note, a message). */
  function fitCard(box) {
    box.hidden = !Array.from(box.querySelectorAll("button[data-action], .job-cancel-note, .job-retries, .job-action-message"))
      .some(function (el) { return !el.hidden; });
  }

  function setButtons(box, state, cancelAsked) {
    box.dataset.state = state;
    box.querySelector(".job-cancel").hidden = !((state === "queued" || state === "running") && !cancelAsked);
    box.querySelector(".job-retry").hidden = !(state === "failed" || state === "cancelled");
    fitCard(box);
  }

  async function act(box, action, button) {
    const id = box.dataset.jobId;
    button.disabled = true;
    try {
      const resp = await fetch(`/api/v1/jobs/${encodeURIComponent(id)}/${action}`, {
        // the session cookie's CSRF rule (backend/auth.py check_cookie_write): a write made with
        // the cookie must be sent as application/json, or it is refused 403
        method: "POST", credentials: "same-origin",
        headers: { Accept: "application/json", "Content-Type": "application/json" }, body: "{}",
      });
      let body = {};
      try { body = await resp.json(); } catch (e) { body = {}; }
      if (!resp.ok) {
        const why = body.detail || resp.statusText;
        const hint = resp.status === 401 ? " (paste an API token to sign in)" : "";
        show(box, `${action === "cancel" ? "Cancel" : "Retry"} refused: ${resp.status} ${why}${hint}`, true);
        return;
      }
      if (action === "retry") {
        show(box, `Retry ${body.retries} sent: the job runs its failed frames again.`, false);
        window.setTimeout(function () { window.location.reload(); }, 600);
        return;
      }
      box.dataset.cancelRequested = "yes";
      setButtons(box, body.state, true);
      // a job cancelled while queued was never planned: it has no frames counted (total 0), and
      // "0 frame(s) not calibrated" would read as if nothing had been stopped
      const ended = body.total === 0
        ? "Cancelled before it was planned: none of its frames will be calibrated."
        : `Cancelled: ${body.cancelled} frame(s) not calibrated.`;
      show(box, body.state === "cancelled" ? ended
        : "Cancel asked: queued frames will not start; frames being calibrated finish first.", false);
      if (body.state === "cancelled") window.setTimeout(function () { window.location.reload(); }, 600);
    } catch (err) {
      show(box, `Could not reach the server (${err.message})`, true);
    } finally {
      button.disabled = false;
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    const box = document.getElementById("job-actions");
    if (!box) return;
    box.querySelectorAll("button[data-action]").forEach(function (b) {
      b.addEventListener("click", function () { act(box, b.dataset.action, b); });
    });
    const status = document.querySelector("main > .job-status[data-job-id]");
    if (status && window.MutationObserver) {
      new MutationObserver(function () {
        if (status.dataset.state) setButtons(box, status.dataset.state, box.dataset.cancelRequested === "yes");
      }).observe(status, { attributes: true, attributeFilter: ["data-state"] });
    }
  });
})();
