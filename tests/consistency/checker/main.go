// Command porcupine-checker checks a history recorded by tests/consistency/recorder.py
// for linearizability with Porcupine, against the model in model.go.
//
//	porcupine-checker [-delta 20ms] [-allow-lost-writes] [-feed] [-html out.html] [-timeout 60s] history.json
//
// It prints its verdict as JSON and exits 0 (linearizable), 1 (a violation:
// the violating history's visualization is written to -html and named in the
// verdict) or 2 (unknown: the search ran out of time). Reads that got no
// answer are left out (they constrain nothing); writes that got none are
// indeterminate (returned at infinity).
//
// -delta D: Δ-linearizability for reads: a read may return a value that was
// current at some point within D before its call (its call is moved D back).
// -allow-lost-writes: acknowledged writes that completed inside the history's
// lossy_windows (a failover without write concern) may be lost.
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
	Documents     int      `json:"documents"`
	Violating     []string `json:"violating_documents,omitempty"`
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
	result, info := porcupine.CheckOperationsVerbose(pm, ops, timeout)
	docs := map[string]bool{}
	for _, op := range ops {
		docs[op.Input.(input).Doc] = true
	}
	v.Documents = len(docs)
	switch result {
	case porcupine.Ok:
		v.Result = "ok"
		return v, 0
	case porcupine.Unknown:
		v.Result = "unknown"
		return v, 2
	}
	v.Result = "violation"
	v.Violating = violating(pm, ops, docs, timeout)
	if html != "" {
		if err := porcupine.VisualizePath(pm, info, html); err != nil {
			fail(err)
		}
		v.HTML = html
	}
	return v, 1
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
		if isRead(r.Kind) {
			call -= delta
		} else if lossy && out.Status != 0 && inside(h.LossyWindows, r.Ret) {
			out.MaybeLost = true
			v.MaybeLost++
			ret = math.MaxInt64
		}
		ops = append(ops, porcupine.Operation{ClientId: r.Client, Input: in, Call: call, Output: out, Return: ret})
	}
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	v.Operations = len(ops)
	return ops
}

func inside(windows [][2]int64, t int64) bool {
	for _, w := range windows {
		if t >= w[0] && t <= w[1] {
			return true
		}
	}
	return false
}

// violating: the documents whose own histories are not linearizable.
func violating(pm porcupine.Model, ops []porcupine.Operation, docs map[string]bool, timeout time.Duration) []string {
	var names []string
	for doc := range docs {
		var mine []porcupine.Operation
		for _, op := range ops {
			if op.Input.(input).Doc == doc {
				mine = append(mine, op)
			}
		}
		if porcupine.CheckOperationsTimeout(pm, mine, timeout) == porcupine.Illegal {
			names = append(names, doc)
		}
	}
	sort.Strings(names)
	return names
}
