// followups dashboard: the few live parts, in plain JavaScript (the pages work without it).
//
// [data-refresh="URL"]: the element's content is replaced with URL's HTML every data-every ms (2000 by
//   default) until that HTML holds an element with [data-final] (a finished enrollment, a completed job).
//   With [data-state="S"] on the element, a new HTML whose [data-state] is no longer S reloads the page
//   instead: what the page shows outside the element (an enrollment's status, its Pause and Stop) is stale.
// select[data-autosubmit]: changing it presses the form's "Update" button (name=_op value=refresh), so the
//   form is drawn again for the new choice (an action's type shows that type's fields).
// time[datetime] > .relative: how far the time is ("in 25 s", "3 min ago"), said again every second, as
//   from the server's clock (<body data-now>, when the page was drawn) plus the time since: every page's
//   times stay true, those of a refreshed part too.
"use strict";

const UNITS = [["d", 86400], ["h", 3600], ["min", 60], ["s", 1]];

// As services/api/dashboard/render.py's relative(): the largest whole unit.
function relative(seconds) {
  const size = Math.abs(seconds);
  for (const [unit, length] of UNITS) {
    if (size >= length) {
      const amount = `${Math.floor(size / length)} ${unit}`;
      return seconds > 0 ? `in ${amount}` : `${amount} ago`;
    }
  }
  return "now";
}

function tickRelativeTimes() {
  const drawn = Date.parse(document.body.getAttribute("data-now") || "");
  const skew = Number.isNaN(drawn) ? 0 : drawn - Date.now(); // the server's clock less this one's
  const tick = () => {
    const now = Date.now() + skew;
    document.querySelectorAll("time[datetime] > .relative").forEach((element) => {
      const at = Date.parse(element.parentElement.getAttribute("datetime"));
      if (Number.isNaN(at)) return;
      const text = `(${relative((at - now) / 1000)})`;
      if (element.textContent !== text) element.textContent = text;
    });
  };
  setInterval(tick, 1000);
}

function refresh(element) {
  const url = element.getAttribute("data-refresh");
  const every = parseInt(element.getAttribute("data-every") || "2000", 10);
  const state = element.getAttribute("data-state");
  const tick = () => {
    fetch(url, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then((response) => (response.ok ? response.text() : Promise.reject(response.status)))
      .then((html) => {
        const next = document.createElement("template");
        next.innerHTML = html;
        const marked = next.content.querySelector("[data-state]");
        if (state !== null && marked && marked.getAttribute("data-state") !== state) {
          window.location.reload(); // the rest of the page (a header, its buttons) shows the old state
          return;
        }
        element.innerHTML = html;
        if (!element.querySelector("[data-final]")) setTimeout(tick, every);
      })
      .catch(() => setTimeout(tick, every * 2));
  };
  if (!element.querySelector("[data-final]")) setTimeout(tick, every);
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-refresh]").forEach(refresh);
  document.querySelectorAll("select[data-autosubmit]").forEach((select) => {
    select.addEventListener("change", () => {
      const button = select.form && select.form.querySelector('button[name="_op"][value="refresh"]');
      if (button) button.click();
    });
  });
  tickRelativeTimes();
  const summary = document.querySelector(".error-summary");
  if (summary) summary.focus();
});
