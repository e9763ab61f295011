// conveyor dashboard: progressive enhancement only. Without this script every page works;
// with it, the parts of a page marked data-live refresh in place every data-refresh ms.
(function () {
  "use strict";
  var every = Number(document.body.getAttribute("data-refresh") || 0);
  var busy = false;

  function refresh() {
    if (busy || document.hidden || !document.querySelector("[data-live]")) {
      return Promise.resolve();
    }
    busy = true;
    return fetch(window.location.href, {
      credentials: "same-origin",
      headers: { "X-Conveyor-Refresh": "1" },
    })
      .then(function (response) {
        if (!response.ok || response.redirected) { return null; }
        return response.text();
      })
      .then(function (html) {
        if (html === null) { return; }
        var fresh = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-live]").forEach(function (old) {
          var next = old.id && fresh.getElementById(old.id);
          // Keep what the user has opened (details) and where focus is.
          if (!next || old.contains(document.activeElement)) { return; }
          old.querySelectorAll("details[open]").forEach(function (d, i) {
            var twin = next.querySelectorAll("details")[i];
            if (twin) { twin.open = true; }
          });
          old.replaceWith(document.importNode(next, true));
        });
      })
      .catch(function () { /* the next tick tries again */ })
      .finally(function () { busy = false; });
  }

  if (every > 0) {
    window.setInterval(refresh, every);
  }
})();
