// The API's documentation: the OpenAPI document needs a token, asked for here and sent
// only to this server (the page's own origin), as the bearer of every request it makes.
"use strict";
(function () {
  const form = document.getElementById("sign-in");
  const problem = document.getElementById("problem");
  const documentUrl = form.dataset.openapi;
  form.addEventListener("submit", async function (event) {
    event.preventDefault();
    const token = document.getElementById("token").value.trim();
    problem.textContent = "";
    let response;
    try {
      response = await fetch(documentUrl, { headers: { Authorization: "Bearer " + token } });
    } catch (error) {
      problem.textContent = "the server did not answer: " + error;
      return;
    }
    if (!response.ok) {
      let detail = response.statusText;
      try { detail = (await response.json()).detail || detail; } catch (error) { /* keep */ }
      problem.textContent = response.status + ": " + detail;
      return;
    }
    const spec = await response.json();
    form.classList.add("hidden");
    const origin = window.location.origin;
    window.ui = SwaggerUIBundle({
      spec: spec,
      dom_id: "#swagger-ui",
      deepLinking: true,
      presets: [SwaggerUIBundle.presets.apis],
      requestInterceptor: function (request) {
        if (new URL(request.url, window.location.href).origin === origin) {
          request.headers.Authorization = "Bearer " + token;
        }
        return request;
      },
    });
  });
})();
