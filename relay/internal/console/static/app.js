// Herald console: the only script the pages load (the Content-Security-Policy
// allows no other). The pages work without it; it adds the overview's live
// refresh and the dead-letter page's "select every row" box.
"use strict";

(function () {
  // Live refresh: replace the overview's body with the server's rendering
  // every 2 s, while the tab is visible. The server escapes everything it
  // renders, as it does for the whole page.
  const live = document.querySelector("[data-live]");
  if (live) {
    const url = live.getAttribute("data-live");
    let busy = false;
    const refresh = async () => {
      if (busy || document.hidden) return;
      busy = true;
      try {
        const resp = await fetch(url, { credentials: "same-origin", cache: "no-store" });
        if (resp.ok) {
          live.innerHTML = await resp.text();
          live.removeAttribute("data-stale");
        } else if (resp.status === 401 || resp.redirected) {
          window.location.reload();
        } else {
          live.setAttribute("data-stale", "true");
        }
      } catch (e) {
        live.setAttribute("data-stale", "true");
      } finally {
        busy = false;
      }
    };
    setInterval(refresh, 2000);
  }

  // Dead letters: the header box ticks every row of the page; the
  // "selected" buttons need a ticked row.
  const all = document.getElementById("select-page");
  const form = document.getElementById("dead-form");
  if (form) {
    const boxes = () => Array.from(form.querySelectorAll('input[type=checkbox][name=id]'));
    const sync = () => {
      const n = boxes().filter((b) => b.checked).length;
      form.querySelectorAll(".needs-selection").forEach((b) => { b.disabled = n === 0; });
    };
    if (all) {
      all.addEventListener("change", () => {
        boxes().forEach((b) => { b.checked = all.checked; });
        sync();
      });
    }
    form.addEventListener("change", sync);
    sync();
  }
})();
