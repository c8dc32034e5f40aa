"""A real OpenID Connect provider for the suite (issue #58): node-oidc-provider issuing JWT access tokens."""
