// Command porcupine-checker checks a history recorded by tests/consistency/recorder.py
// for linearizability with Porcupine, against the model in model.go.
//
//	porcupine-checker [-delta 20ms] [-allow-lost-writes] [-feed] [-html out.html] [-timeout 60s] history.json
//
// It prints its verdict as JSON and exits 0 (linearizable), 1 (a violation:
// first violating document's history, visualized, is written to -html and
// named in the verdict) or 2 (unknown: the search ran out of time). Each
// document is checked on its own, all within -timeout (and the
// visualization's search within half of it more). Reads that got no
// answer are left out (they constrain nothing); writes that got none are
// indeterminate (returned at infinity).
//
// -delta D: Δ-linearizability for reads: a read may return a value that was
// current at some point within D before its call (its call is moved D back).
// -allow-lost-writes: acknowledged writes that completed inside the history's
// lossy_windows (a failover without write concern) may be lost: each may
// take effect or not, at a point within its interval; reads and refused
// writes that completed there are left out (they may have seen what was lost).
// -feed: the change feed (the history's feed) is a constraint: each write
// that takes effect takes its document's next event (see model.go).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

type record struct {
	N      int               `json:"n"`
	Client int               `json:"client"`
	Kind   string            `json:"kind"`
	Doc    string            `json:"doc"`
	Via    string            `json:"via"`
	Call   int64             `json:"call"`
	Ret    int64             `json:"ret"`
	In     map[string]string `json:"in"`
	Status *int              `json:"status"`
	Etag   *string           `json:"etag"`
	Value  *string           `json:"value"`
}

type history struct {
	Scenario     string     `json:"scenario"`
	Records      []record   `json:"records"`
	LossyWindows [][2]int64 `json:"lossy_windows"`
	Feed         []event    `json:"feed"`
}

// event: a change-feed event as docs/api.md gives it (the time is not used).
type event struct {
	Op   string  `json:"op"`
	ID   string  `json:"id"`
	Etag *string `json:"etag"`
}

type verdict struct {
	Result        string   `json:"result"`
	Operations    int      `json:"operations"`
	Indeterminate int      `json:"indeterminate"`
	DroppedReads  int      `json:"dropped_reads"`
	MaybeLost     int      `json:"maybe_lost"`
	Excused       int      `json:"excused"`
	Documents     int      `json:"documents"`
	Violating     []string `json:"violating_documents,omitempty"`
	Unknown       []string `json:"unknown_documents,omitempty"`
	HTML          string   `json:"html,omitempty"`
	DeltaNs       int64    `json:"delta_ns"`
	Feed          bool     `json:"feed"`
}

func main() {
	delta := flag.Duration("delta", 0, "allow reads this stale (Δ-linearizability)")
	lossy := flag.Bool("allow-lost-writes", false, "acknowledged writes inside the history's lossy_windows may be lost")
	withFeed := flag.Bool("feed", false, "hold each document's writes to the order of its change-feed events")
	html := flag.String("html", "", "write the visualization here when the history is not linearizable")
	timeout := flag.Duration("timeout", 60*time.Second, "give up (result unknown) after this long")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: porcupine-checker [flags] history.json")
		os.Exit(3)
	}
	data, err := os.ReadFile(flag.Arg(0))
	if err != nil {
		fail(err)
	}
	var h history
	if err := json.Unmarshal(data, &h); err != nil {
		fail(err)
	}
	v, code := check(h, *delta, *lossy, *withFeed, *html, *timeout)
	out, _ := json.Marshal(v)
	fmt.Println(string(out))
	os.Exit(code)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(3)
}

func check(h history, delta time.Duration, lossy, withFeed bool, html string, timeout time.Duration) (verdict, int) {
	v := verdict{DeltaNs: int64(delta), Feed: withFeed}
	ops := operations(h, int64(delta), lossy, &v)
	m := model{}
	if withFeed {
		m.feeds = map[string][]feedEvent{}
		for _, e := range h.Feed {
			etag := ""
			if e.Etag != nil {
				etag = *e.Etag
			}
			m.feeds[e.ID] = append(m.feeds[e.ID], feedEvent{Op: e.Op, Etag: etag})
		}
	}
	pm := m.porcupine()
	byDoc := map[string][]porcupine.Operation{}
	for _, op := range ops {
		doc := op.Input.(input).Doc
		byDoc[doc] = append(byDoc[doc], op)
	}
	v.Documents = len(byDoc)
	// Each document on its own (what Porcupine's partitioning does too), so the verdict names them.
	var unknown []string
	deadline := time.Now().Add(timeout) // for all the documents together
	for _, doc := range sortedKeys(byDoc) {
		limit := time.Until(deadline)
		if len(v.Violating) > 0 && limit > 2*time.Second {
			limit = 2 * time.Second // the verdict is known: the others are named if they are quick to prove
		}
		if limit <= 0 {
			unknown = append(unknown, doc)
			continue
		}
		switch porcupine.CheckOperationsTimeout(pm, byDoc[doc], limit) {
		case porcupine.Illegal:
			v.Violating = append(v.Violating, doc)
		case porcupine.Unknown:
			unknown = append(unknown, doc)
		}
	}
	switch {
	case len(v.Violating) == 0 && len(unknown) == 0:
		v.Result = "ok"
		return v, 0
	case len(v.Violating) == 0:
		v.Result = "unknown"
		v.Unknown = unknown
		return v, 2
	}
	v.Result = "violation"
	v.Unknown = unknown
	if html != "" {
		// The first violating document's history: Porcupine shows its longest partial linearizations.
		_, info := porcupine.CheckOperationsVerbose(pm, byDoc[v.Violating[0]], timeout/2)
		if err := porcupine.VisualizePath(pm, info, html); err != nil {
			fail(err)
		}
		v.HTML = html
	}
	return v, 1
}

func sortedKeys(m map[string][]porcupine.Operation) []string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// operations: the records as Porcupine operations, by call time.
func operations(h history, delta int64, lossy bool, v *verdict) []porcupine.Operation {
	var ops []porcupine.Operation
	for _, r := range h.Records {
		in := input{Kind: r.Kind, Doc: r.Doc, Value: r.In["value"], Patch: r.In["patch"], IfMatch: r.In["if_match"], INM: r.In["inm"]}
		out := output{}
		if r.Etag != nil {
			out.Etag = *r.Etag
		}
		if r.Value != nil {
			out.Value, out.HasValue = *r.Value, true
		}
		call, ret := r.Call, r.Ret
		if r.Status == nil {
			if isRead(r.Kind) {
				v.DroppedReads++
				continue
			}
			v.Indeterminate++
			ret = math.MaxInt64
		} else {
			out.Status = *r.Status
		}
		if lossy && r.Status != nil && inside(h.LossyWindows, r.Ret) {
			if isRead(r.Kind) || !changed(r.Kind, out.Status) {
				// It may have read (or been refused on) what was then lost: nothing to hold it to.
				v.Excused++
				continue
			}
			// Taken or lost at its linearization point, inside its interval: returning it at
			// infinity (as an indeterminate write) made the search of a failover's history blow up.
			out.MaybeLost = true
			v.MaybeLost++
		}
		if isRead(r.Kind) {
			call -= delta
		}
		ops = append(ops, porcupine.Operation{ClientId: r.Client, Input: in, Call: call, Output: out, Return: ret})
	}
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	v.Operations = len(ops)
	return ops
}

// changed: the status says the write took effect.
func changed(kind string, status int) bool {
	switch kind {
	case "delete", "cdelete":
		return status == 204
	}
	return status == 200 || status == 201
}

func inside(windows [][2]int64, t int64) bool {
	for _, w := range windows {
		if t >= w[0] && t <= w[1] {
			return true
		}
	}
	return false
}
