"""The API service: the Litestar REST API (and, later, the ingress actors for platform events)."""
