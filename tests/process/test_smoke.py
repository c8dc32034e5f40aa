"""The README's first promise: PUT then GET returns exactly the bytes."""


def test_put_then_get_returns_the_same_bytes(api):
    body = b'{"name":"ada",  "n": 1.50}'
    assert api.put_json("/v1/users/u1", body).status_code == 201
    response = api.get("/v1/users/u1")
    assert response.status_code == 200
    assert response.content == body
    assert response.headers["Content-Type"] == "application/json"
