// The model: one document with its ETag, as docs/api.md describes it (not as the code does it).
//
// A history is partitioned by document id; each partition's state is whether
// the document exists, its value (canonical JSON: sorted keys, compact) and
// its ETag ("" when an indeterminate write left it unknown: the next read
// names it). Kinds, with the statuses docs/api.md gives them:
//
//	get, head       200 (value, ETag) if it exists, else 404
//	get304          If-None-Match: E: 304 if it exists with ETag E, else 200 or 404
//	mget            an item of a multi-get (value, no ETag), or null (404)
//	put             201 created / 200 replaced; the value and a new ETag
//	cas             If-Match: E: 200 if it exists with ETag E, else 412
//	create          If-None-Match: *: 201 if it does not exist, else 412
//	patch           merge patch (RFC 7396): 200 with the merged value if it exists, else 404;
//	                409 write-conflict (a batch's patch that lost its race) changes nothing
//	delete          204 if it exists, else 404
//	cdelete         If-Match: E: 204 if it exists with ETag E, else 412
//
// An indeterminate write (status 0: a timeout, a reset, a 5xx) is returned at
// infinity, Porcupine's convention: it may take effect at any point after its
// call, or never. With the feed as a constraint (-feed), every write that
// takes effect takes the document's next event in the change feed: the same
// kind and ETag (an indeterminate write with no ETag learns it there).
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/anishathalye/porcupine"
)

type input struct {
	Kind    string
	Doc     string
	Value   string // put, cas, create: the document written
	Patch   string // patch: the merge patch
	IfMatch string // cas, cdelete
	INM     string // get304
}

type output struct {
	Status    int    // 0: unknown
	Etag      string // "" when none or unknown
	Value     string
	HasValue  bool
	MaybeLost bool // acknowledged, but inside a window where acknowledged writes may be lost
}

type state struct {
	Exists bool
	Value  string
	Etag   string
	Feed   int // events of the document's feed taken so far (-feed)
}

type feedEvent struct {
	Op   string
	Etag string
}

var absent = state{}

func isWrite(kind string) bool {
	switch kind {
	case "put", "cas", "create", "patch", "delete", "cdelete":
		return true
	}
	return false
}

func isRead(kind string) bool { return !isWrite(kind) }

// etagAgrees: a known ETag equals the one seen; an unknown one agrees with anything.
func etagAgrees(s state, seen string) bool { return seen == "" || s.Etag == "" || s.Etag == seen }

func learn(s state, seen string) state {
	if s.Etag == "" && seen != "" {
		s.Etag = seen
	}
	return s
}

type model struct {
	feeds map[string][]feedEvent // nil: the feed is not a constraint
}

// step: every state the document may be in after the operation, none if it cannot answer so.
func (m model) step(s state, in input, out output) []state {
	if isRead(in.Kind) {
		return m.read(s, in, out)
	}
	var after []state
	for _, next := range m.write(s, in, out) {
		if next == s {
			after = append(after, next)
		} else if fed, ok := m.takeEvent(s, next, in); ok {
			after = append(after, fed)
		}
	}
	if (out.Status == 0 || out.MaybeLost) && !contains(after, s) {
		after = append(after, s) // it never happened (or was lost)
	}
	return after
}

func (m model) read(s state, in input, out output) []state {
	switch {
	case out.Status == 404:
		return when(!s.Exists, s)
	case in.Kind == "get304" && out.Status == 304:
		return when(s.Exists && etagAgrees(s, in.INM), learn(s, in.INM))
	case out.Status == 200:
		ok := s.Exists && (!out.HasValue || out.Value == s.Value) && etagAgrees(s, out.Etag)
		return when(ok, learn(s, out.Etag))
	}
	return nil
}

// write: the states a write leads to given its answer; the unchanged state where it did nothing.
func (m model) write(s state, in input, out output) []state {
	written := state{Exists: true, Value: in.Value, Etag: out.Etag, Feed: s.Feed}
	unknown := out.Status == 0
	matches := s.Exists && (s.Etag == "" || s.Etag == in.IfMatch)
	mismatches := !s.Exists || s.Etag != in.IfMatch // an unknown ETag may mismatch too
	switch in.Kind {
	case "put":
		created, replaced := out.Status == 201 && !s.Exists, out.Status == 200 && s.Exists
		return when(unknown || created || replaced, written)
	case "create":
		if unknown {
			return []state{pick(!s.Exists, written, s)}
		}
		return either(out.Status == 201 && !s.Exists, written, out.Status == 412 && s.Exists, s)
	case "cas":
		if unknown {
			return both(matches, written, mismatches, s)
		}
		return either(out.Status == 200 && matches, written, out.Status == 412 && mismatches, s)
	case "patch":
		if !s.Exists {
			return when(unknown || out.Status == 404, s)
		}
		merged, err := mergePatch(s.Value, in.Patch)
		if err != nil {
			return nil
		}
		patched := state{Exists: true, Value: merged, Etag: out.Etag, Feed: s.Feed}
		if unknown {
			return []state{patched}
		}
		ok := out.Status == 200 && (!out.HasValue || out.Value == merged)
		return either(ok, patched, out.Status == 409, s)
	case "delete":
		if unknown {
			return []state{pick(s.Exists, state{Feed: s.Feed}, s)}
		}
		return either(out.Status == 204 && s.Exists, state{Feed: s.Feed}, out.Status == 404 && !s.Exists, s)
	case "cdelete":
		gone := state{Feed: s.Feed}
		if unknown {
			return both(matches, gone, mismatches, s)
		}
		return either(out.Status == 204 && matches, gone, out.Status == 412 && mismatches, s)
	}
	return nil
}

// takeEvent: with the feed as a constraint, a write that changed the document takes its next event.
func (m model) takeEvent(before, after state, in input) (state, bool) {
	if m.feeds == nil {
		return after, true
	}
	kind, events := in.Kind, m.feeds[in.Doc]
	if before.Feed >= len(events) {
		return after, false
	}
	event := events[before.Feed]
	switch {
	case kind == "delete" || kind == "cdelete":
		if event.Op != "delete" {
			return after, false
		}
	case kind == "patch":
		if event.Op != "patch" {
			return after, false
		}
	case event.Op != "put" && event.Op != "create":
		return after, false
	}
	if after.Exists {
		if after.Etag != "" && after.Etag != event.Etag {
			return after, false
		}
		after.Etag = event.Etag
	}
	after.Feed = before.Feed + 1
	return after, true
}

func when(ok bool, s state) []state {
	if ok {
		return []state{s}
	}
	return nil
}

func pick(first bool, a, b state) state {
	if first {
		return a
	}
	return b
}

func either(okA bool, a state, okB bool, b state) []state {
	if okA {
		return []state{a}
	}
	return when(okB, b)
}

func both(okA bool, a state, okB bool, b state) []state {
	var out []state
	if okA {
		out = append(out, a)
	}
	if okB {
		out = append(out, b)
	}
	return out
}

func contains(states []state, s state) bool {
	for _, one := range states {
		if one == s {
			return true
		}
	}
	return false
}

// mergePatch: RFC 7396 on canonical JSON, answered canonical.
func mergePatch(target, patch string) (string, error) {
	var t, p interface{}
	if err := decode(target, &t); err != nil {
		return "", err
	}
	if err := decode(patch, &p); err != nil {
		return "", err
	}
	merged, err := json.Marshal(apply(t, p))
	return string(merged), err
}

func apply(target, patch interface{}) interface{} {
	members, ok := patch.(map[string]interface{})
	if !ok {
		return patch
	}
	result := map[string]interface{}{}
	if object, isObject := target.(map[string]interface{}); isObject {
		for k, v := range object {
			result[k] = v
		}
	}
	for k, v := range members {
		if v == nil {
			delete(result, k)
		} else {
			result[k] = apply(result[k], v)
		}
	}
	return result
}

func decode(text string, into interface{}) error {
	decoder := json.NewDecoder(bytes.NewReader([]byte(text)))
	decoder.UseNumber()
	return decoder.Decode(into)
}

func (m model) porcupine() porcupine.Model {
	nondeterministic := porcupine.NondeterministicModel{
		Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
			byDoc := map[string][]porcupine.Operation{}
			var order []string
			for _, op := range history {
				doc := op.Input.(input).Doc
				if _, seen := byDoc[doc]; !seen {
					order = append(order, doc)
				}
				byDoc[doc] = append(byDoc[doc], op)
			}
			var parts [][]porcupine.Operation
			for _, doc := range order {
				parts = append(parts, byDoc[doc])
			}
			return parts
		},
		Init: func() []interface{} { return []interface{}{absent} },
		Step: func(s, in, out interface{}) []interface{} {
			var next []interface{}
			for _, one := range m.step(s.(state), in.(input), out.(output)) {
				next = append(next, one)
			}
			return next
		},
		Equal: func(a, b interface{}) bool { return a.(state) == b.(state) },
		Hash: func(s interface{}) uint64 {
			h := fnv.New64a()
			fmt.Fprintf(h, "%v", s)
			return h.Sum64()
		},
		DescribeOperation: describe,
		DescribeState: func(s interface{}) string {
			st := s.(state)
			if !st.Exists {
				return fmt.Sprintf("absent (feed %d)", st.Feed)
			}
			return fmt.Sprintf("%s %s (feed %d)", st.Etag, st.Value, st.Feed)
		},
	}
	return nondeterministic.ToModel()
}

func describe(i, o interface{}) string {
	in, out := i.(input), o.(output)
	var args []string
	for _, a := range []string{in.IfMatch, in.INM, in.Value, in.Patch} {
		if a != "" {
			args = append(args, a)
		}
	}
	status := fmt.Sprint(out.Status)
	if out.Status == 0 {
		status = "?"
	}
	if out.MaybeLost {
		status += " (may be lost)"
	}
	result := strings.TrimSpace(fmt.Sprintf("%s %s %s", status, out.Etag, out.Value))
	return fmt.Sprintf("%s(%s %s) -> %s", in.Kind, in.Doc, strings.Join(args, " "), result)
}
