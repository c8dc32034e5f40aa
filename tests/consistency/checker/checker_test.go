package main

import (
	"path/filepath"
	"testing"
	"time"
)

// op builds a record: kind on doc "a" over [call, ret], with status (nil: indeterminate), etag and value.
func op(kind string, call, ret int64, status int, etag, value string, in map[string]string) record {
	r := record{Client: int(call % 3), Kind: kind, Doc: "a", Call: call, Ret: ret, In: in}
	if status != 0 {
		r.Status = &status
	}
	if etag != "" {
		r.Etag = &etag
	}
	if value != "" {
		r.Value = &value
	}
	return r
}

func put(call, ret int64, status int, etag, value string) record {
	return op("put", call, ret, status, etag, value, map[string]string{"value": value})
}

func get(call, ret int64, status int, etag, value string) record {
	return op("get", call, ret, status, etag, value, nil)
}

func verdictOf(t *testing.T, h history, delta time.Duration, lossy, feed bool) string {
	t.Helper()
	html := filepath.Join(t.TempDir(), "violation.html")
	v, _ := check(h, delta, lossy, feed, html, 10*time.Second)
	return v.Result
}

func TestALinearizableHistoryPasses(t *testing.T) {
	h := history{Records: []record{
		put(0, 10, 201, `"e1"`, `{"v":1}`),
		get(5, 15, 404, "", ""), // concurrent with the create: may come first
		get(20, 30, 200, `"e1"`, `{"v":1}`),
		op("cas", 40, 50, 200, `"e2"`, `{"v":2}`, map[string]string{"value": `{"v":2}`, "if_match": `"e1"`}),
		op("cas", 45, 55, 412, "", "", map[string]string{"value": `{"v":3}`, "if_match": `"e1"`}),
		op("patch", 60, 70, 200, `"e3"`, `{"v":2,"w":1}`, map[string]string{"patch": `{"w":1}`}),
		op("create", 80, 90, 412, "", "", map[string]string{"value": `{"v":4}`}),
		op("delete", 100, 110, 204, "", "", nil),
		get(120, 130, 404, "", ""),
	}}
	if got := verdictOf(t, h, 0, false, false); got != "ok" {
		t.Fatalf("want ok, got %s", got)
	}
}

func TestAStaleReadIsAViolationAndWithinDeltaItIsNot(t *testing.T) {
	h := history{Records: []record{
		put(0, 10, 201, `"e1"`, `{"v":1}`),
		put(20, 30, 200, `"e2"`, `{"v":2}`),
		get(40, 50, 200, `"e1"`, `{"v":1}`), // the write of [20, 30] had completed
	}}
	if got := verdictOf(t, h, 0, false, false); got != "violation" {
		t.Fatalf("want violation, got %s", got)
	}
	if got := verdictOf(t, h, 5*time.Nanosecond, false, false); got != "violation" {
		t.Fatalf("Δ 5 ns: want violation, got %s", got)
	}
	if got := verdictOf(t, h, 15*time.Nanosecond, false, false); got != "ok" {
		t.Fatalf("Δ 15 ns: want ok, got %s", got)
	}
}

func TestTwoCompareAndSetsOnOneETagCannotBothWin(t *testing.T) {
	h := history{Records: []record{
		put(0, 10, 201, `"e1"`, `{"v":1}`),
		op("cas", 20, 30, 200, `"e2"`, `{"v":2}`, map[string]string{"value": `{"v":2}`, "if_match": `"e1"`}),
		op("cas", 25, 35, 200, `"e3"`, `{"v":3}`, map[string]string{"value": `{"v":3}`, "if_match": `"e1"`}),
	}}
	if got := verdictOf(t, h, 0, false, false); got != "violation" {
		t.Fatalf("want violation, got %s", got)
	}
}

func TestALostAcknowledgedWriteIsAViolationUnlessLossIsAllowedThere(t *testing.T) {
	h := history{Records: []record{
		put(0, 10, 201, `"e1"`, `{"v":1}`),
		put(20, 30, 200, `"e2"`, `{"v":2}`),
		get(40, 50, 200, `"e1"`, `{"v":1}`),
	}, LossyWindows: [][2]int64{{15, 35}}}
	if got := verdictOf(t, h, 0, false, false); got != "violation" {
		t.Fatalf("want violation, got %s", got)
	}
	if got := verdictOf(t, h, 0, true, false); got != "ok" {
		t.Fatalf("lost writes allowed: want ok, got %s", got)
	}
	// Read before it was lost: excused inside the window, not after it.
	h.Records = append(h.Records, get(31, 33, 200, `"e2"`, `{"v":2}`))
	if got := verdictOf(t, h, 0, true, false); got != "ok" {
		t.Fatalf("a read of a lost write inside the window: want ok, got %s", got)
	}
	h.Records = append(h.Records, get(60, 70, 200, `"e2"`, `{"v":2}`))
	if got := verdictOf(t, h, 0, true, false); got != "violation" {
		t.Fatalf("the lost write read back after the window: want violation, got %s", got)
	}
}

func TestAnIndeterminateWriteMayHaveHappenedOrNot(t *testing.T) {
	h := history{Records: []record{
		put(0, 10, 201, `"e1"`, `{"v":1}`),
		put(20, 30, 0, "", `{"v":2}`), // a 5xx: unknown
		get(40, 50, 200, `"e1"`, `{"v":1}`),
		get(60, 70, 200, `"e9"`, `{"v":2}`), // it did happen, after all: its ETag is learnt here
		get(80, 90, 200, `"e9"`, `{"v":2}`),
	}}
	if got := verdictOf(t, h, 0, false, false); got != "ok" {
		t.Fatalf("want ok, got %s", got)
	}
	h.Records = append(h.Records, get(100, 110, 200, `"e1"`, `{"v":1}`)) // back in time
	if got := verdictOf(t, h, 0, false, false); got != "violation" {
		t.Fatalf("want violation, got %s", got)
	}
}

func TestAMergePatchMustMergeIntoTheCurrentValue(t *testing.T) {
	h := history{Records: []record{
		put(0, 10, 201, `"e1"`, `{"o":{"a":1},"v":1}`),
		op("patch", 20, 30, 200, `"e2"`, `{"o":{"b":2},"v":1}`, map[string]string{"patch": `{"o":{"a":null,"b":2}}`}),
		get(40, 50, 200, `"e2"`, `{"o":{"b":2},"v":1}`),
	}}
	if got := verdictOf(t, h, 0, false, false); got != "ok" {
		t.Fatalf("want ok, got %s", got)
	}
	h.Records[1].Value = h.Records[0].Value // a patch that answered the old document
	if got := verdictOf(t, h, 0, false, false); got != "violation" {
		t.Fatalf("want violation, got %s", got)
	}
}

func TestTheFeedMustAgreeWithALinearization(t *testing.T) {
	e1, e2 := `"e1"`, `"e2"`
	h := history{Records: []record{
		put(0, 10, 201, e1, `{"v":1}`),
		put(20, 30, 200, e2, `{"v":2}`),
	}}
	h.Feed = []event{{"put", "a", &e2}, {"put", "a", &e1}}
	if got := verdictOf(t, h, 0, false, false); got != "ok" {
		t.Fatalf("without the feed: want ok, got %s", got)
	}
	if got := verdictOf(t, h, 0, false, true); got != "violation" {
		t.Fatalf("feed in the wrong order: want violation, got %s", got)
	}
	h.Feed[0].Etag, h.Feed[1].Etag = &e1, &e2
	if got := verdictOf(t, h, 0, false, true); got != "ok" {
		t.Fatalf("feed in order: want ok, got %s", got)
	}
}
