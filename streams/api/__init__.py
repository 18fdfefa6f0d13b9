"""The HTTP API every worker serves: bearer-token auth and forwarding to the owning worker (http.py),
then one module per area (memory, dashboard, health)."""
