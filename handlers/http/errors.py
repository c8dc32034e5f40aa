"""The one error type of the API, rendered as RFC 9457 problem details."""

from __future__ import annotations

import http
from typing import Any, Dict, Optional

import cyclone.web

PROBLEM_TYPE_PREFIX = "urn:jetway:problem:"


class ApiError(cyclone.web.HTTPError):
    """An HTTP error with a problem type, a detail and optional headers.

    It subclasses Cyclone's ``HTTPError`` so Cyclone routes it to
    ``write_error`` without logging it as an uncaught exception.
    """

    def __init__(
        self,
        status: int,
        problem: str,
        detail: str,
        headers: Optional[Dict[str, str]] = None,
        extensions: Optional[Dict[str, Any]] = None,
    ) -> None:
        super().__init__(status)
        self.problem = problem
        self.detail = detail
        self.headers = headers or {}
        # RFC 9457 extension members (e.g. "errors" of a schema violation), after the standard ones.
        self.extensions = extensions or {}

    def as_problem(self) -> Dict[str, object]:
        """The ``application/problem+json`` members."""
        return {
            "type": PROBLEM_TYPE_PREFIX + self.problem,
            "title": http.HTTPStatus(self.status_code).phrase,
            "status": self.status_code,
            "detail": self.detail,
            **self.extensions,
        }

    def __str__(self) -> str:
        return f"{self.status_code} {self.problem}: {self.detail}"


def bad_request(detail: str, problem: str = "bad-request") -> ApiError:
    return ApiError(400, problem, detail)


def not_found(detail: str = "no such document") -> ApiError:
    return ApiError(404, "not-found", detail)


def precondition_failed(detail: str = "the document does not match the request's conditions") -> ApiError:
    return ApiError(412, "precondition-failed", detail)
