// What helm's operation is doing, as its writes through the fence show it:
// for a holder asked to stop (cooperative preemption), whether it may stop
// now, judged and acted on in one step with the fence's own count of
// helm's writes (CloseUnlessBusy).

package helmx

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// HookAnnotation is the annotation helm marks a chart's hook resources with.
const HookAnnotation = "helm.sh/hook"

// phase is what helm is doing, kept under WriteFence.mu. hook is the kind
// of the hook helm started last (its resource was the last one helm wrote:
// helm writes nothing else until the hook has run) and hookPath that
// resource's path; both are cleared when helm writes anything else, or
// deletes that resource (a hook-succeeded policy). undoing is set for good
// once helm undoes the release in a way it cannot cancel: a revision
// created pending-rollback (a rollback, or an upgrade's
// --rollback-on-failure), or written uninstalling (an uninstall, or an
// install's --rollback-on-failure).
type phase struct {
	hook, hookPath string
	undoing        string
	changed        chan struct{}
}

// phaseOf is what one write of helm's says of its phase; unchanged when it
// says nothing (a delete of another resource, a body that cannot be read).
type phaseOf struct {
	unchanged      bool
	hook, hookPath string
	undoing        string
	deleted        string // the path a delete removes
}

// apply records helm's write p; w.mu is held.
func (ph *phase) apply(p phaseOf) {
	if p.unchanged {
		return
	}
	hook, path, undoing := p.hook, p.hookPath, ph.undoing
	if p.undoing != "" {
		undoing = p.undoing
	}
	if p.deleted != "" {
		if p.deleted != ph.hookPath {
			return
		}
		hook, path = "", ""
	}
	if hook == ph.hook && path == ph.hookPath && undoing == ph.undoing {
		return
	}
	ph.hook, ph.hookPath, ph.undoing = hook, path, undoing
	if ph.changed != nil {
		close(ph.changed)
		ph.changed = nil
	}
}

// busy says why helm cannot be stopped now ("" when it can) and returns
// the channel closed at its next change; w.mu is held.
func (ph *phase) busy() (string, <-chan struct{}) {
	if ph.changed == nil {
		ph.changed = make(chan struct{})
	}
	switch {
	case ph.undoing != "":
		return ph.undoing, ph.changed
	case ph.hook != "":
		return "a " + ph.hook + " hook of the chart is running", ph.changed
	}
	return "", ph.changed
}

// Busy reports why helm's operation cannot be stopped safely at this
// moment ("" when it can): a hook of the chart is running (stopping it
// half-way could leave what it does half done: a migration, a backup), or
// helm is undoing the release (a rollback, an uninstall), which it does
// not cancel. changed is closed at helm's next change of phase.
func (w *WriteFence) Busy() (why string, changed <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.phase.busy()
}

// ResetPhase forgets what helm did before its operation starts: a
// recovery's rollback under the same lock (--recover-strategy=rollback)
// leaves the phase undoing, and the operation that follows must still be
// judged by its own writes.
func (w *WriteFence) ResetPhase() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.phase.apply(phaseOf{})
	w.phase.undoing = ""
}

// OperationEnded tells the fence that helm's operation returned: a
// request to stop that comes later finds nothing to stop (Busy says
// Ended).
func (w *WriteFence) OperationEnded() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.phase.apply(phaseOf{hook: w.phase.hook, hookPath: w.phase.hookPath, undoing: Ended})
}

// Ended is what Busy says once helm's operation returned (OperationEnded).
const Ended = "helm's operation has ended"

// CloseUnlessBusy closes the fence, as Drain's first step does, unless
// helm is busy (Busy), in one step with the fence's count of helm's
// writes: a write let in before it closed the fence is one whose phase was
// known to be stoppable, and none is let in after. It returns why not and
// the channel closed at helm's next change of phase when busy; the caller
// then calls Drain. closing, when set, is called just before the fence
// closes, in the same step (it must not call the fence): whoever sees a
// write refused by the closed fence can tell why.
func (w *WriteFence) CloseUnlessBusy(closing func()) (why string, changed <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if why, changed = w.phase.busy(); why != "" {
		return why, changed
	}
	if closing != nil {
		closing()
	}
	w.closeLocked()
	return "", nil
}

// phaseOfWrite reads what helm's write req says of its phase, before the
// fence counts it in (writeStarted), and returns req with its body
// restored. A release record's write ends a hook (helm writes its records
// before and after its hooks); created pending-rollback or written
// uninstalling, it starts an undo. Any other write with a body starts a
// hook when its object carries the hook annotation, and ends one
// otherwise; a delete of the hook's own resource ends it.
func (f *fenceRT) phaseOfWrite(req *http.Request, g *GuardedWrites) (*http.Request, phaseOf, error) {
	if req.Method == http.MethodDelete {
		return req, phaseOf{deleted: req.URL.Path}, nil
	}
	if req.Body == nil {
		return req, phaseOf{unchanged: true}, nil
	}
	body, err := readBody(req)
	if err != nil {
		return nil, phaseOf{}, fmt.Errorf("helm-autorecover: reading helm's request body: %w", err)
	}
	req = withRawBody(req, body)
	if m := recordPath.FindStringSubmatch(req.URL.Path); m != nil && m[1] == g.Namespace && m[2] == g.Resource {
		// helm's storage driver sends its records as protobuf (client-go's
		// typed clients prefer it), read as create and update read them.
		status := ""
		d, err := decode(body)
		if err == nil {
			status = d.meta.Labels[LabelStatus]
		}
		// Decoded once: the record's create or update takes it from here
		// (decodeRequest).
		req = req.WithContext(context.WithValue(req.Context(), decodedKey{}, decodedBody{body: body, d: d, err: err}))
		p := phaseOf{}
		switch {
		case status == "pending-rollback" && req.Method == http.MethodPost:
			p.undoing = "helm is rolling the release back, which it cannot cancel"
		case status == "uninstalling":
			p.undoing = "helm is uninstalling the release, which it cannot cancel"
		case status == "failed" && req.Method == http.MethodPut && f.own(g, revisionOf(m[3], g.Release)):
			// helm's operation failed: it ends, or undoes itself next
			// (--rollback-on-failure), which must not be cut short.
			p.undoing = "helm's operation failed and is ending (with --rollback-on-failure it rolls back next)"
		}
		return req, p, nil
	}
	// Everything else helm writes goes through its unstructured client:
	// JSON, or an apply patch.
	meta := metadataOf(body)
	p := phaseOf{hook: meta.hook()}
	if p.hook != "" {
		p.hookPath = req.URL.Path
		if req.Method == http.MethodPost && meta.Name != "" {
			// A create is sent to the collection; its delete names it.
			p.hookPath = strings.TrimSuffix(p.hookPath, "/") + "/" + meta.Name
		}
	}
	return req, p, nil
}

// objectMeta is the part of a written object's metadata the phase reads.
type objectMeta struct {
	Name        string            `json:"name"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	yamlHook    string
}

func (m objectMeta) hook() string {
	if h := m.Annotations[HookAnnotation]; h != "" {
		return h
	}
	return m.yamlHook
}

// metadataOf reads the metadata of the object in body: JSON, as helm
// sends it; for a YAML apply patch, the hook annotation alone, as written
// on a line of its own.
func metadataOf(body []byte) objectMeta {
	var obj struct {
		Metadata objectMeta `json:"metadata"`
	}
	if json.Unmarshal(body, &obj) == nil {
		return obj.Metadata
	}
	for line := range bytes.Lines(body) {
		k, v, ok := bytes.Cut(bytes.TrimSpace(line), []byte(":"))
		if ok && string(bytes.Trim(k, `"'`)) == HookAnnotation {
			return objectMeta{yamlHook: string(bytes.Trim(bytes.TrimSpace(v), `"'`))}
		}
	}
	return objectMeta{}
}
