// Every operation through openapi-fetch, typed by openapi-typescript from /openapi.json.
//
// tests/process/test_generated_clients.py generates ./schema.d.ts from the running
// server's own document (no hand edits), type-checks this file against it
// with tsc, and runs it with node: `node use_ts_client.js BASE_URL TOKEN`.
// It exits non-zero at the first answer that is not what the API documents.
import assert from "node:assert/strict";
import createClient from "openapi-fetch";
import type { components, paths } from "./schema.js";

type Problem = components["schemas"]["Problem"];
type Document = components["schemas"]["Document"];
// The feed's 200 is a page (application/json) or an event stream (text/event-stream): a long poll gets the page.
type ChangesPage = components["schemas"]["ChangesPage"];

const [baseUrl, token] = process.argv.slice(2);
const collection = "gents";
const problemType = "urn:jetway:problem:";

const anonymous = createClient<paths>({ baseUrl });
const client = createClient<paths>({ baseUrl, headers: { Authorization: `Bearer ${token}` } });

function isProblem(error: unknown, status: number, slug: string): void {
  const problem = error as Problem;
  assert.equal(problem.status, status, JSON.stringify(error));
  assert.equal(problem.type, problemType + slug);
}

async function health(): Promise<void> {
  const live = await anonymous.GET("/healthz");
  assert.equal(live.data?.status, "ok");
  const ready = await anonymous.GET("/readyz");
  assert.equal(ready.data?.status, "ready");
  const metrics = await anonymous.GET("/metrics", { parseAs: "text" });
  assert.match(metrics.data ?? "", /# TYPE/);
  const spec = await anonymous.GET("/openapi.json");
  assert.equal(spec.data?.openapi, "3.1.0");
  for (const path of ["/healthz", "/readyz", "/metrics", "/openapi.json", "/docs"] as const) {
    const head = await anonymous.HEAD(path);
    assert.equal(head.response.status, 200, path);
  }
}

async function docs(): Promise<void> {
  const page = await anonymous.GET("/docs", { parseAs: "text" });
  assert.match(page.data ?? "", /id="swagger-ui"/);
  const etag = page.response.headers.get("ETag") ?? "";
  const again = await anonymous.GET("/docs", { params: { header: { "If-None-Match": etag } }, parseAs: "text" });
  assert.equal(again.response.status, 304);
  const params = { path: { asset: "start.js" as const } };
  const start = await anonymous.GET("/docs/assets/{asset}", { params, parseAs: "text" });
  assert.match(start.data ?? "", /SwaggerUIBundle/);
  const head = await anonymous.HEAD("/docs/assets/{asset}", { params: { path: { asset: "swagger-ui.css" } } });
  assert.equal(head.response.status, 200);
  assert.equal(head.response.headers.get("Cache-Control"), "no-cache");
}

async function documents(): Promise<void> {
  const path = "/v1/{collection}/{id}" as const;
  const params = { path: { collection, id: "d1" } };
  const created = await client.PUT(path, { params, body: { n: 1, s: "é" } });
  assert.equal(created.response.status, 201);
  assert.deepEqual(created.data, { n: 1, s: "é" });
  let etag = created.response.headers.get("ETag") ?? "";

  const exists = await client.PUT(path, { params: { ...params, header: { "If-None-Match": "*" } }, body: {} });
  isProblem(exists.error, 412, "precondition-failed");
  const replaced = await client.PUT(path, { params: { ...params, header: { "If-Match": etag } }, body: { n: 2 } });
  assert.equal(replaced.response.status, 200);
  etag = replaced.response.headers.get("ETag") ?? "";

  const got = await client.GET(path, { params });
  const body: Document | undefined = got.data;
  assert.deepEqual(body, { n: 2 });
  assert.equal(got.response.headers.get("ETag"), etag);
  const unchanged = await client.GET(path, { params: { ...params, header: { "If-None-Match": etag } } });
  assert.equal(unchanged.response.status, 304);
  const head = await client.HEAD(path, { params });
  assert.equal(head.response.headers.get("ETag"), etag);

  const patched = await client.PATCH(path, {
    params: { ...params, header: { "If-Match": etag } },
    body: { n: null, tags: ["a"] },
    headers: { "Content-Type": "application/merge-patch+json" },
  });
  assert.deepEqual(patched.data, { tags: ["a"] });

  const deleted = await client.DELETE(path, { params });
  assert.equal(deleted.response.status, 204);
  isProblem((await client.GET(path, { params })).error, 404, "not-found");
  isProblem((await client.DELETE(path, { params })).error, 404, "not-found");
  isProblem((await client.GET(path, { params: { path: { collection, id: "a b" } } })).error, 400, "invalid-id");
  isProblem((await anonymous.GET(path, { params })).error, 401, "unauthorized");
}

async function collections(): Promise<void> {
  const made: string[] = [];
  for (let n = 0; n < 7; n++) {
    const created = await client.POST("/v1/{collection}", {
      params: { path: { collection }, query: { ttl: 3600 } },
      body: { n },
    });
    assert.equal(created.response.status, 201);
    made.push((created.response.headers.get("Location") ?? "").split("/").pop() ?? "");
  }

  const seen: unknown[] = [];
  let cursor: string | null = null;
  let pages = 0;
  do {
    const query: { limit: number; cursor?: string } = cursor ? { limit: 3, cursor } : { limit: 3 };
    const { data } = await client.GET("/v1/{collection}", { params: { path: { collection }, query } });
    // The same operation answers NDJSON (a string) when asked for it; this asks for JSON.
    assert.ok(data && typeof data !== "string" && "next" in data, "a page");
    seen.push(...data.items.map((item) => item.n));
    cursor = data.next;
    pages++;
  } while (cursor !== null);
  assert.deepEqual(seen, [0, 1, 2, 3, 4, 5, 6]);
  assert.equal(pages, 3);
  const head = await client.HEAD("/v1/{collection}", { params: { path: { collection } } });
  assert.equal(head.response.status, 200);

  // openapi-fetch sends an array as ids=a&ids=b; the server takes that as well as ids=a,b.
  const ids = [made[2], "missing", made[0], made[2]];
  const expected = [{ n: 2 }, null, { n: 0 }, { n: 2 }];
  const byGet = await client.GET("/v1/{collection}", { params: { path: { collection }, query: { ids } } });
  assert.ok(typeof byGet.data !== "string", "JSON, not NDJSON");
  assert.deepEqual(byGet.data?.items, expected);
  const byPost = await client.POST("/v1/_get/{collection}", { params: { path: { collection } }, body: { ids } });
  assert.deepEqual(byPost.data?.items, expected);
  const invalid = await client.POST("/v1/_get/{collection}", {
    params: { path: { collection } },
    body: { ids: ["ok", ".."] },
  });
  isProblem(invalid.error, 400, "invalid-id");
}

async function batch(): Promise<void> {
  const operations = [
    { op: "put" as const, collection, id: "b1", document: { n: 1 } },
    { op: "create" as const, collection, document: { n: 2 } },
    { op: "patch" as const, collection, id: "b1", patch: { m: 2 } },
    { op: "get" as const, collection, id: "b1" },
    { op: "delete" as const, collection, id: "b1" },
    { op: "get" as const, collection, id: "b1" },
  ];
  const headers = { "Idempotency-Key": "gents-batch" };
  const answer = await client.POST("/v1/_batch", { body: { operations }, params: { header: headers } });
  assert.equal(answer.response.status, 200);
  const results = answer.data?.results ?? [];
  assert.deepEqual(
    results.map((result) => result.status),
    [201, 201, 200, 200, 204, 404],
  );
  assert.deepEqual(results[3].document, { n: 1, m: 2 });
  assert.equal(results[5].problem?.type, "urn:jetway:problem:not-found");
  const replayed = await client.POST("/v1/_batch", { body: { operations }, params: { header: headers } });
  assert.equal(replayed.response.headers.get("Idempotency-Replayed"), "true");
  const empty = await client.POST("/v1/_batch", { body: { operations: [] } });
  isProblem(empty.error, 400, "invalid-batch");
}

async function collectionSettings(): Promise<void> {
  const rules = "gents-rules";
  const path = "/v1/_collections/{collection}" as const;
  const params = { path: { collection: rules } };
  const schema = { type: "object", required: ["n"], properties: { n: { type: "integer" } } };
  const made = await client.PUT(path, { params, body: { schema, ttl: 60 } });
  assert.equal(made.response.status, 201);
  assert.equal(made.data?.ttl, 60);
  const etag = made.response.headers.get("ETag") ?? "";
  const got = await client.GET(path, { params });
  assert.deepEqual(got.data?.schema, schema);
  const unchanged = await client.GET(path, { params: { ...params, header: { "If-None-Match": etag } } });
  assert.equal(unchanged.response.status, 304);
  assert.equal((await client.HEAD(path, { params })).response.headers.get("ETag"), etag);
  const listed = await client.GET("/v1/_collections");
  assert.deepEqual(listed.data?.items.map((item) => item.collection).sort(), [rules, "typed"]);
  assert.equal((await client.HEAD("/v1/_collections")).response.status, 200);
  isProblem((await client.PUT(path, { params, body: { schema: { type: "nope" } } })).error, 422, "invalid-schema");

  const violation = await client.PUT("/v1/{collection}/{id}", {
    params: { path: { collection: rules, id: "r1" } },
    body: { n: "one" },
  });
  isProblem(violation.error, 422, "schema-violation");
  assert.deepEqual(
    violation.error?.errors?.map((error) => [error.pointer, error.keyword]),
    [["/n", "type"]],
  );
  const stale = await client.DELETE(path, { params: { ...params, header: { "If-Match": '"stale"' } } });
  isProblem(stale.error, 412, "precondition-failed");
  assert.equal((await client.DELETE(path, { params: { ...params, header: { "If-Match": etag } } })).response.status, 204);
  isProblem((await client.GET(path, { params })).error, 404, "not-found");

  // Collection "typed" has a schema (set by the test before generating): its body type is checked by tsc.
  const typed: components["schemas"]["TypedDocument"] = { email: "ada@example.com", age: 36 };
  const put = await client.PUT("/v1/typed/{id}", { params: { path: { id: "t1" } }, body: typed });
  assert.equal(put.response.status, 201);
  const created = await client.POST("/v1/typed", { body: typed });
  assert.equal(created.response.status, 201);
  const refused = await client.PUT("/v1/typed/{id}", { params: { path: { id: "t2" } }, body: { email: "nope" } });
  isProblem(refused.error, 422, "schema-violation");
}

// One query with in on collection "typed"'s index (email, age): the values' documents merged by age, newest
// first, paged; a malformed in is the server's 400.
async function typedQuery(): Promise<void> {
  for (const [id, email, age] of [["q1", "grace@example.com", 40], ["q2", "linus@example.com", 50]] as const) {
    const put = await client.PUT("/v1/typed/{id}", { params: { path: { id } }, body: { email, age } });
    assert.equal(put.response.status, 201);
  }
  const email = ['in.(grace@example.com,"ada@example.com")'];
  const seen: unknown[] = [];
  let cursor: string | null = null;
  do {
    const query: { email: string[]; order: "age.desc"; limit: number; cursor?: string } = cursor
      ? { email, order: "age.desc", limit: 2, cursor }
      : { email, order: "age.desc", limit: 2 };
    const { data } = await client.GET("/v1/typed", { params: { query } });
    assert.ok(data && typeof data !== "string" && "next" in data, "a page");
    seen.push(...data.items.map((item) => [item.email, item.age]));
    cursor = data.next;
  } while (cursor !== null);
  // t1 and the created one: ada, 36 (by id, descending, after grace's 40).
  assert.deepEqual(seen, [
    ["grace@example.com", 40],
    ["ada@example.com", 36],
    ["ada@example.com", 36],
  ]);
  const refused = await client.GET("/v1/typed", { params: { query: { email: ["in.(a,b,c"] } } });
  isProblem(refused.error, 400, "invalid-query");
}

// One query with cs on collection "typed"'s array index (tags, string[]): the documents whose tags hold red, by
// id, each once however often red is in its array, paged one by one; two values are the server's 400.
async function typedContains(): Promise<void> {
  const tagged: [string, string[]][] = [
    ["c1", ["red", "blue", "red"]],
    ["c2", ["blue"]],
    ["c3", ["red", "red", "red"]],
    ["c4", ["green", "red"]],
  ];
  for (const [index, [id, tags]] of tagged.entries()) {
    const body: components["schemas"]["TypedDocument"] = { email: "tagged@example.com", age: index + 1, tags };
    const put = await client.PUT("/v1/typed/{id}", { params: { path: { id } }, body });
    assert.equal(put.response.status, 201);
  }
  const tags = ["cs.{red}"];
  const seen: unknown[] = [];
  let cursor: string | null = null;
  do {
    const query: { tags: string[]; limit: number; cursor?: string } = cursor
      ? { tags, limit: 1, cursor }
      : { tags, limit: 1 };
    const { data } = await client.GET("/v1/typed", { params: { query } });
    assert.ok(data && typeof data !== "string" && "next" in data, "a page");
    seen.push(...data.items.map((item) => [item.age, item.tags]));
    cursor = data.next;
  } while (cursor !== null);
  assert.deepEqual(seen, [
    [1, ["red", "blue", "red"]],
    [3, ["red", "red", "red"]],
    [4, ["green", "red"]],
  ]);
  assert.equal(new Set(seen.map((pair) => (pair as unknown[])[0])).size, seen.length);
  // Their count, with the second page: Prefer a header parameter, Content-Range a response header.
  const first = await client.GET("/v1/typed", { params: { query: { tags, limit: 1 } } });
  assert.ok(first.data && typeof first.data !== "string" && "next" in first.data && first.data.next, "a page");
  const counted = await client.GET("/v1/typed", {
    params: { query: { tags, limit: 1, cursor: first.data.next }, header: { Prefer: "count=exact" } },
  });
  assert.ok(counted.data && typeof counted.data !== "string" && "next" in counted.data, "a page");
  assert.deepEqual(counted.data.items.map((item) => item.age), [3]);
  assert.equal(counted.response.headers.get("Content-Range"), "1-1/3");
  assert.equal(counted.response.headers.get("Preference-Applied"), "count=exact");
  const refused = await client.GET("/v1/typed", { params: { query: { tags: ["cs.{red,blue}"] } } });
  isProblem(refused.error, 400, "invalid-query");
}

async function changes(): Promise<void> {
  const path = "/v1/_changes/{collection}" as const;
  const now = await client.GET(path, { params: { path: { collection }, query: { wait: 0 } } });
  const first = now.data as ChangesPage;
  assert.deepEqual(first.events, []);
  const since = first.next;
  const put = await client.PUT("/v1/{collection}/{id}", { params: { path: { collection, id: "f1" } }, body: { f: 1 } });
  assert.equal(put.response.status, 201);
  const later = await client.GET(path, { params: { path: { collection }, query: { since, wait: 5 } } });
  assert.deepEqual(
    (later.data as ChangesPage).events.map((event) => [event.op, event.id]),
    [["put", "f1"]],
  );
  const ticket = await client.POST("/v1/_changes/{collection}/tickets", { params: { path: { collection } } });
  assert.equal(ticket.response.status, 201);
  // The ticket is a query-string scheme: a client that adds it to every request, as EventSource's URL would.
  const byTicket = createClient<paths>({
    baseUrl,
    fetch: (request: Request) => {
      const url = new URL(request.url);
      url.searchParams.set("ticket", ticket.data?.ticket ?? "");
      return fetch(url, { method: request.method, headers: request.headers });
    },
  });
  const again = await byTicket.GET(path, { params: { path: { collection }, query: { since, wait: 0 } } });
  assert.deepEqual(
    (again.data as ChangesPage).events.map((event) => event.id),
    ["f1"],
  );
  isProblem((await client.GET(path, { params: { path: { collection }, query: { limit: 0 } } })).error, 400, "invalid-limit");
}

await health();
await docs();
await documents();
await collections();
await batch();
await collectionSettings();
await typedQuery();
await typedContains();
await changes();
console.log("typescript client: every operation answered as documented");
