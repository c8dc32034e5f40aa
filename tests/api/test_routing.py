"""api.application: a path goes to the first route whose pattern matches it, trying only those it can match."""

from __future__ import annotations

import pytest

from api.app import make_app
from api.application import literal_prefix
from api.config import Settings


@pytest.mark.parametrize(
    ("pattern", "prefix"),
    [
        ("/v1/_get/([^/]+)$", "/v1/_get/"),
        ("/v1/_collections/?$", "/v1/_collections"),  # the slash may be absent
        ("/v1/([^/]+)/?$", "/v1/"),
        ("/openapi\\.json$", "/openapi"),
        ("/healthz$", "/healthz"),
        ("/a+b$", "/a"),
        ("/ab*$", "/a"),
        ("/ab{0,2}$", "/a"),
        ("(/x)?/y$", ""),
    ],
)
def test_literal_prefix_is_what_every_match_starts_with(pattern, prefix):
    assert literal_prefix(pattern) == prefix


@pytest.fixture(scope="module")
def app():
    return make_app(Settings(access_log=False), store=object(), gate=None, reactor=None)


@pytest.mark.parametrize(
    ("path", "route", "args"),
    [
        ("/v1/users/u1", "DocumentHandler", ["users", "u1"]),
        ("/v1/users/a%20b+c", "DocumentHandler", ["users", "a b c"]),  # unquoted as Cyclone does
        ("/v1/users", "CollectionHandler", ["users"]),
        ("/v1/users/", "CollectionHandler", ["users"]),
        ("/v1/_get/users", "MultiGetHandler", ["users"]),
        ("/v1/_changes/users", "ChangesHandler", ["users"]),
        ("/v1/_changes/users/tickets", "TicketHandler", ["users"]),
        ("/v1/_batch", "BatchHandler", []),
        ("/v1/_collections", "CollectionSettingsListHandler", []),
        ("/v1/_collections/", "CollectionSettingsListHandler", []),
        ("/v1/_collections/users", "CollectionSettingsHandler", ["users"]),
        ("/v1/_getx/users", "DocumentHandler", ["_getx", "users"]),  # not the multi-get
        ("/healthz", "LivenessHandler", []),
        ("/readyz", "ReadinessHandler", []),
        ("/metrics", "MetricsHandler", []),
        ("/openapi.json", "OpenApiHandler", []),
        ("/docs", "DocsPageHandler", []),
        ("/docs/assets/swagger-ui.css", "DocsAssetHandler", ["swagger-ui.css"]),
    ],
)
def test_a_path_goes_to_its_route(app, path, route, args):
    spec, got = app.route(path)
    assert spec is not None, path
    assert spec.handler_class.__name__ == route
    assert list(got) == args


@pytest.mark.parametrize("path", ["/", "/v1", "/v1/a/b/c", "/healthzz", "/openapiXjson", "/docs/assets/a/b", "/v2/a/b"])
def test_a_path_no_route_matches_has_none(app, path):
    assert app.route(path) == (None, [])
