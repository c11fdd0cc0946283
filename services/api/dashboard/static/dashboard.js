// followups dashboard: the few live parts, in plain JavaScript (the pages work without it).
//
// [data-refresh="URL"]: the element's content is replaced with URL's HTML every data-every ms (2000 by
//   default) until that HTML holds an element with [data-final] (a finished enrollment, a completed job).
//   With [data-state="S"] on the element, a new HTML whose [data-state] is no longer S reloads the page
//   instead: what the page shows outside the element (an enrollment's status, its Pause and Stop) is stale.
// select[data-autosubmit]: changing it presses the form's "Update" button (name=_op value=refresh), so the
//   form is drawn again for the new choice (an action's type shows that type's fields).
"use strict";

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
  const summary = document.querySelector(".error-summary");
  if (summary) summary.focus();
});
