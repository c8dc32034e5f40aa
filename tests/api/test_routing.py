"""api.application: a path goes to the first route whose template matches it, as its regex would."""

from __future__ import annotations

import random

import pytest

from api.app import make_app
from api.config import Settings
from handlers.operation import Resource, Route, routes
from handlers.operations import OPERATIONS

# Texts a path is made of here: every literal of the table's templates, and segments of every kind.
_PIECES = [
    "/",
    "//",
    "v1",
    "_get",
    "_changes",
    "tickets",
    "_collections",
    "_batch",
    "_import",
    "healthz",
    "docs",
    "assets",
    "openapi.json",
    "openapiXjson",
    "a",
    "a%20b",
    "x.y",
    "+",
    "..",
    "-",
]


@pytest.mark.parametrize("seed", range(4))
def test_a_route_matches_a_path_exactly_when_its_regex_does_with_the_same_groups(seed):
    """Route.arguments is the regex's match (Cyclone's, with its ``$``), found by the template's slashes."""
    rng = random.Random(seed)
    table = routes(OPERATIONS, {})
    paths = {"/" + "/".join(route.pattern.replace("([^/]+)", "s").replace("\\", "").split("/")[1:]) for route in table}
    for _ in range(3000):
        paths.add("".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 7))))
    for path in sorted(paths):
        for route in table:
            match = route.regex.match(path)
            assert route.arguments(path) == (None if match is None else match.groups()), (route.pattern, path)


def test_a_template_whose_segment_does_not_end_at_a_slash_is_refused():
    with pytest.raises(ValueError, match="end at a slash"):
        Route(Resource("/a/{x}.json", object, "", ""), None)


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
