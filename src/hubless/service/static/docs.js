// Starts Swagger UI on /docs (a file, not inline script: the CSP forbids inline script).
window.ui = SwaggerUIBundle({ url: "/openapi.json", dom_id: "#swagger-ui", deepLinking: true });
