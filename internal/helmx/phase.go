// What helm's operation is doing, as its writes through the fence show it:
// for a holder asked to stop (cooperative preemption), whether it may stop
// now (Busy).

package helmx

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
)

// HookAnnotation is the annotation helm marks a chart's hook resources with.
const HookAnnotation = "helm.sh/hook"

// phase is what helm is doing. hook is the kind of the hook helm started
// last (its resource was the last one helm wrote: helm writes nothing else
// until the hook has run), "" once helm writes anything else; rollingBack
// is set once helm created a revision pending-rollback (a rollback, or an
// upgrade's --rollback-on-failure), which helm cannot cancel.
type phase struct {
	mu          sync.Mutex
	hook        string
	rollingBack bool
	changed     chan struct{}
}

// set records helm's last write and wakes those waiting for a change.
func (p *phase) set(hook string, rollingBack bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	rollingBack = rollingBack || p.rollingBack
	if hook == p.hook && rollingBack == p.rollingBack {
		return
	}
	p.hook, p.rollingBack = hook, rollingBack
	if p.changed != nil {
		close(p.changed)
		p.changed = nil
	}
}

// reset forgets the phase of an earlier operation (Guard).
func (p *phase) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hook, p.rollingBack = "", false
}

// Busy reports why helm's operation cannot be stopped safely at this
// moment ("" when it can): a hook of the chart is running (stopping it
// half-way could leave what it does half done: a migration, a backup), or
// helm is rolling back (it does not cancel a rollback). changed is closed
// at helm's next change of phase.
func (w *WriteFence) Busy() (why string, changed <-chan struct{}) {
	p := &w.phase
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.changed == nil {
		p.changed = make(chan struct{})
	}
	switch {
	case p.rollingBack:
		why = "helm is rolling the release back, which it cannot cancel"
	case p.hook != "":
		why = "a " + p.hook + " hook of the chart is running"
	}
	return why, p.changed
}

// notePhase reads helm's write of a resource other than a release record:
// a hook's resource starts its hook, anything else ends it. A write without
// a body (a delete: helm removing a hook's earlier resource before it
// creates it again, or once it succeeded) changes nothing.
func (f *fenceRT) notePhase(req *http.Request) (*http.Request, error) {
	if req.Body == nil || req.Method == http.MethodDelete {
		return req, nil
	}
	body, err := readBody(req)
	if err != nil {
		return nil, fmt.Errorf("helm-autorecover: reading helm's request body: %w", err)
	}
	f.w.phase.set(hookOf(body), false)
	return withRawBody(req, body), nil
}

// hookOf returns the value of the hook annotation on the object in body
// (JSON, as helm sends it, or YAML), "" when it carries none.
func hookOf(body []byte) string {
	var obj struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
	}
	if json.Unmarshal(body, &obj) == nil {
		return obj.Metadata.Annotations[HookAnnotation]
	}
	// Not JSON: a YAML apply patch. The annotation key, as written on a
	// line of its own.
	for line := range bytes.Lines(body) {
		k, v, ok := bytes.Cut(bytes.TrimSpace(line), []byte(":"))
		if ok && string(bytes.Trim(k, `"'`)) == HookAnnotation {
			return string(bytes.Trim(bytes.TrimSpace(v), `"'`))
		}
	}
	return ""
}
