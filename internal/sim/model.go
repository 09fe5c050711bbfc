package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
)

// Model is an in-process model of the API server: namespaced objects of any
// resource kept as JSON, with one resourceVersion counter, server-set
// uid and creationTimestamp, get, list (label and field selectors),
// watch, create, conditional update, JSON merge patch and conditional
// delete, and a Date header on every answer. It serves requests directly
// (Serve), with no network; Link adds the network and its faults.
//
// Every committed write is kept in Writes, in commit order, with the
// client that sent it (the X-Sim-Client header) and the server time.
type Model struct {
	mu      sync.Mutex
	rv      int64
	objs    map[key]obj
	events  []event
	changed chan struct{} // closed and replaced on every commit
	sels    map[string]selector
	sent    time.Time // of the request being served
	manager string    // its field manager
	closed  chan struct{}
	// Writes are the committed writes, in commit order.
	Writes []Write
	// Requests counts every request served, by verb.
	Requests map[string]int
}

// ClientHeader names the request header a Link tags its client's requests
// with.
const ClientHeader = "X-Sim-Client"

// SentHeader carries the time a Link was handed the request.
const SentHeader = "X-Sim-Sent"

// key names an object: its resource ("secrets", "leases.coordination.k8s.io"),
// namespace and name.
type key struct{ res, ns, name string }

// obj is a stored object as JSON, with its resourceVersion. Its encodings
// are made once per version: the object (raw) and, on first use, its
// metadata alone (meta, as PartialObjectMetadata).
type obj struct {
	rv     int64
	body   map[string]any
	raw    []byte
	meta   *[]byte
	labels labels.Set
}

// newObj encodes body, stored at resourceVersion rv.
func newObj(rv int64, body map[string]any) obj {
	raw, err := json.Marshal(body)
	if err != nil {
		// The model only stores what it decoded from JSON.
		panic(fmt.Sprintf("sim: encoding a stored object: %v", err))
	}
	ls := labels.Set{}
	if l, ok := metaOf(body)["labels"].(map[string]any); ok {
		for k, v := range l {
			ls[k], _ = v.(string)
		}
	}
	return obj{rv: rv, body: body, raw: raw, meta: new([]byte), labels: ls}
}

// metadata returns o as PartialObjectMetadata, the way the API server
// answers a request that accepts metadata only.
func (o obj) metadata() []byte {
	if *o.meta == nil {
		b, err := json.Marshal(map[string]any{"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": metaOf(o.body)})
		if err != nil {
			panic(fmt.Sprintf("sim: encoding a stored object's metadata: %v", err))
		}
		*o.meta = b
	}
	return *o.meta
}

// stale reports whether a write's resourceVersion precondition (rv, a
// string or absent) names another version than o's.
func (o obj) stale(rv any) bool {
	v, _ := rv.(string)
	return v != "" && v != strconv.FormatInt(o.rv, 10)
}

// keepIdentity gives body, the object replacing o, o's name, namespace, uid
// and creationTimestamp: a write cannot change them.
func (o obj) keepIdentity(body map[string]any, name, ns string) {
	meta, oldMeta := metaOf(body), metaOf(o.body)
	meta["name"], meta["namespace"] = name, ns
	meta["uid"], meta["creationTimestamp"] = oldMeta["uid"], oldMeta["creationTimestamp"]
}

// event is one change, for watches: the object after it (before it, for
// a delete).
type event struct {
	typ string // ADDED, MODIFIED, DELETED
	k   key
	obj
}

// Write is one committed write.
type Write struct {
	Seq int64 // the resourceVersion it produced
	At  time.Time
	// Sent is when the client's link was handed the request (before its
	// latency and any pause): a bound on when the client sent it.
	Sent   time.Time
	Client string
	Verb   string // create, update, patch, delete
	Res    string
	NS     string
	Name   string
	// Object is the object after the write (before it, for a delete).
	Object map[string]any
	// Cond is the precondition the request carried, so that the checker
	// can tell a conditional write from a blind one: "new" for a create
	// (it fails when the name exists), "rv=N" for an update, a patch or a
	// delete conditional on resourceVersion N, "uid=U" for a delete
	// conditional on the UID alone, "" for none.
	Cond string
}

// NewModel returns an empty model.
func NewModel() *Model {
	return &Model{objs: map[key]obj{}, sels: map[string]selector{}, changed: make(chan struct{}), closed: make(chan struct{}), Requests: map[string]int{}}
}

// modelState is a model's data, shared by no bubble: what save returns and
// restore takes.
type modelState struct {
	rv       int64
	objs     map[key]obj
	events   []event
	writes   []Write
	requests map[string]int
}

// save returns a copy of m's data. Stored objects are never changed once
// committed, so the copy shares their bodies.
func (m *Model) save() modelState {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := modelState{rv: m.rv, objs: make(map[key]obj, len(m.objs)), events: slices.Clone(m.events), writes: slices.Clone(m.Writes), requests: maps.Clone(m.Requests)}
	for k, o := range m.objs {
		st.objs[k] = o.fresh()
	}
	for i := range st.events {
		st.events[i].obj = st.events[i].fresh()
	}
	return st
}

// restore gives m, a new model, a copy of the data st.
func (m *Model) restore(st modelState) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rv, m.events, m.Writes, m.Requests = st.rv, slices.Clone(st.events), slices.Clone(st.writes), maps.Clone(st.requests)
	m.objs = make(map[key]obj, len(st.objs))
	for k, o := range st.objs {
		m.objs[k] = o.fresh()
	}
	for i := range m.events {
		m.events[i].obj = m.events[i].fresh()
	}
}

// fresh returns o with its own slot for the metadata encoding, which is
// filled on first use.
func (o obj) fresh() obj {
	meta := *o.meta
	o.meta = &meta
	return o
}

// Close ends every watch.
func (m *Model) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	select {
	case <-m.closed:
	default:
		close(m.closed)
	}
}

// kinds gives the apiVersion and kind of the resources the protocol uses.
var kinds = map[string][2]string{
	"secrets":                    {"v1", "Secret"},
	"configmaps":                 {"v1", "ConfigMap"},
	"events":                     {"v1", "Event"},
	"leases.coordination.k8s.io": {"coordination.k8s.io/v1", "Lease"},
	"events.events.k8s.io":       {"events.k8s.io/v1", "Event"},
}

// route parses a request path into a resource, namespace and name.
func route(p string) (res, ns, name string, ok bool) {
	parts := strings.Split(strings.Trim(p, "/"), "/")
	var group string
	switch {
	case len(parts) >= 2 && parts[0] == "api" && parts[1] == "v1":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		group = parts[1]
		parts = parts[3:]
	default:
		return "", "", "", false
	}
	if len(parts) < 3 || parts[0] != "namespaces" {
		return "", "", "", false
	}
	ns, res = parts[1], parts[2]
	if group != "" {
		res += "." + group
	}
	if len(parts) == 4 {
		name = parts[3]
	} else if len(parts) != 3 {
		return "", "", "", false
	}
	return res, ns, name, true
}

// Serve answers one request at the current (virtual) time.
func (m *Model) Serve(req *http.Request) *http.Response {
	now := time.Now()
	resp := m.serve(req, now)
	resp.Request = req
	if resp.Header == nil {
		resp.Header = http.Header{}
	}
	resp.Header.Set("Date", now.UTC().Format(http.TimeFormat))
	if resp.Header.Get("Content-Type") == "" {
		resp.Header.Set("Content-Type", "application/json")
	}
	return resp
}

func (m *Model) serve(req *http.Request, now time.Time) *http.Response {
	if req.URL.Path == "/version" {
		return jsonResponse(http.StatusOK, map[string]any{"major": "1", "minor": "35", "gitVersion": "v1.35.0-sim"})
	}
	res, ns, name, ok := route(req.URL.Path)
	if !ok {
		return statusResponse(http.StatusNotFound, "NotFound", "the model does not serve "+req.URL.Path)
	}
	if _, known := kinds[res]; !known {
		return statusResponse(http.StatusNotFound, "NotFound", "the model does not serve "+res)
	}
	q := req.URL.Query()
	var body map[string]any
	if req.Body != nil {
		raw, err := io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			return statusResponse(http.StatusBadRequest, "BadRequest", err.Error())
		}
		if len(raw) > 0 {
			if err := json.Unmarshal(raw, &body); err != nil {
				return statusResponse(http.StatusBadRequest, "BadRequest", err.Error())
			}
		}
	}
	client := req.Header.Get(ClientHeader)
	sent, _ := time.Parse(time.RFC3339Nano, req.Header.Get(SentHeader))
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sent = sent
	m.manager = q.Get("fieldManager")
	if m.manager == "" {
		m.manager = req.Header.Get("User-Agent")
	}
	switch {
	case req.Method == http.MethodGet && name == "" && q.Get("watch") == "true":
		m.Requests["watch"]++
		return m.watch(req.Context(), res, ns, q)
	case req.Method == http.MethodGet && name == "":
		m.Requests["list"]++
		return m.list(res, ns, q, metadataOnly(req, "PartialObjectMetadataList"))
	case req.Method == http.MethodGet:
		m.Requests["get"]++
		o, ok := m.objs[key{res, ns, name}]
		if !ok {
			return notFound(res, name)
		}
		if metadataOnly(req, "PartialObjectMetadata") {
			return rawResponse(http.StatusOK, o.metadata())
		}
		return rawResponse(http.StatusOK, o.raw)
	case req.Method == http.MethodPost && name == "":
		m.Requests["create"]++
		return m.answer(req, m.create(res, ns, body, client, now))
	case req.Method == http.MethodPut && name != "":
		m.Requests["update"]++
		return m.answer(req, m.update(res, ns, name, body, client, now))
	case req.Method == http.MethodPatch && name != "":
		m.Requests["patch"]++
		if ct := req.Header.Get("Content-Type"); ct != "application/merge-patch+json" {
			return statusResponse(http.StatusUnsupportedMediaType, "UnsupportedMediaType", "the model applies JSON merge patches only, not "+ct)
		}
		return m.answer(req, m.patch(res, ns, name, body, client, now))
	case req.Method == http.MethodDelete && name != "":
		m.Requests["delete"]++
		return m.delete(res, ns, name, body, client, now)
	}
	return statusResponse(http.StatusMethodNotAllowed, "MethodNotAllowed", req.Method+" "+req.URL.Path)
}

// commit stores body (nil deletes) under k as the next resourceVersion and
// records the write and the event. It returns the object written.
func (m *Model) commit(k key, verb, typ string, body map[string]any, cond, client string, now time.Time) obj {
	m.rv++
	var o obj
	if typ == "DELETED" {
		o = m.objs[k]
		delete(m.objs, k)
	} else {
		meta := metaOf(body)
		meta["resourceVersion"] = strconv.FormatInt(m.rv, 10)
		meta["managedFields"] = m.managed(k, m.manager, now)
		o = newObj(m.rv, body)
		m.objs[k] = o
	}
	ev := o
	ev.rv = m.rv
	m.events = append(m.events, event{typ: typ, k: k, obj: ev})
	m.Writes = append(m.Writes, Write{Seq: m.rv, At: now, Sent: m.sent, Client: client, Verb: verb, Res: k.res, NS: k.ns, Name: k.name, Object: o.body, Cond: cond})
	close(m.changed)
	m.changed = make(chan struct{})
	return o
}

// written is a write's outcome: the object written, or the response to an
// error.
type written struct {
	o    obj
	code int
	err  *http.Response
}

// answer returns the response to a write: the object written (its metadata
// alone when the request accepts only that), or the error.
func (m *Model) answer(req *http.Request, w written) *http.Response {
	switch {
	case w.err != nil:
		return w.err
	case metadataOnly(req, "PartialObjectMetadata"):
		return rawResponse(w.code, w.o.metadata())
	}
	return rawResponse(w.code, w.o.raw)
}

// metadataOnly reports whether req accepts only metadata, as kind (the
// first media type of its Accept header names it with as=).
func metadataOnly(req *http.Request, kind string) bool {
	first, _, _ := strings.Cut(req.Header.Get("Accept"), ",")
	for _, p := range strings.Split(first, ";") {
		if strings.TrimSpace(p) == "as="+kind {
			return true
		}
	}
	return false
}

func (m *Model) create(res, ns string, body map[string]any, client string, now time.Time) written {
	if body == nil {
		return written{err: statusResponse(http.StatusBadRequest, "BadRequest", "no object given")}
	}
	meta := metaOf(body)
	name, _ := meta["name"].(string)
	if gen, _ := meta["generateName"].(string); name == "" && gen != "" {
		name = fmt.Sprintf("%s%d", gen, m.rv+1)
		meta["name"] = name
	}
	if name == "" {
		return written{err: statusResponse(http.StatusUnprocessableEntity, "Invalid", "metadata.name is required")}
	}
	k := key{res, ns, name}
	if _, exists := m.objs[k]; exists {
		return written{err: statusResponse(http.StatusConflict, "AlreadyExists", fmt.Sprintf("%s %q already exists", res, name))}
	}
	setKind(res, body)
	meta["namespace"] = ns
	meta["uid"] = fmt.Sprintf("uid-%d", m.rv+1)
	meta["creationTimestamp"] = now.UTC().Truncate(time.Second).Format(time.RFC3339)
	return written{o: m.commit(k, "create", "ADDED", body, "new", client, now), code: http.StatusCreated}
}

func (m *Model) update(res, ns, name string, body map[string]any, client string, now time.Time) written {
	k := key{res, ns, name}
	old, ok := m.objs[k]
	if !ok {
		return written{err: notFound(res, name)}
	}
	if body == nil {
		return written{err: statusResponse(http.StatusBadRequest, "BadRequest", "no object given")}
	}
	rv := metaOf(body)["resourceVersion"]
	if old.stale(rv) {
		return written{err: conflict(res, name)}
	}
	setKind(res, body)
	old.keepIdentity(body, name, ns)
	return written{o: m.commit(k, "update", "MODIFIED", body, condOf(rv, nil), client, now), code: http.StatusOK}
}

func (m *Model) patch(res, ns, name string, patch map[string]any, client string, now time.Time) written {
	k := key{res, ns, name}
	old, ok := m.objs[k]
	if !ok {
		return written{err: notFound(res, name)}
	}
	rv := metaOf(patch)["resourceVersion"]
	if old.stale(rv) {
		return written{err: conflict(res, name)}
	}
	body := mergePatch(deepCopy(old.body), patch).(map[string]any)
	old.keepIdentity(body, name, ns)
	return written{o: m.commit(k, "patch", "MODIFIED", body, condOf(rv, nil), client, now), code: http.StatusOK}
}

func (m *Model) delete(res, ns, name string, opts map[string]any, client string, now time.Time) *http.Response {
	k := key{res, ns, name}
	old, ok := m.objs[k]
	if !ok {
		return notFound(res, name)
	}
	pre, _ := opts["preconditions"].(map[string]any)
	if old.stale(pre["resourceVersion"]) {
		return conflict(res, name)
	}
	if uid, _ := pre["uid"].(string); uid != "" && uid != metaOf(old.body)["uid"] {
		return conflict(res, name)
	}
	m.commit(k, "delete", "DELETED", nil, condOf(pre["resourceVersion"], pre["uid"]), client, now)
	return jsonResponse(http.StatusOK, map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Success"})
}

// condOf names a write's precondition (Write.Cond) from the
// resourceVersion and the UID it required, each a string or absent.
func condOf(rv, uid any) string {
	if v, _ := rv.(string); v != "" {
		return "rv=" + v
	}
	if u, _ := uid.(string); u != "" {
		return "uid=" + u
	}
	return ""
}

// selector is a list or watch request's label and field selectors.
type selector struct {
	labels labels.Selector
	fields fields.Selector
}

// selector parses the selectors of a list or watch request, once per
// distinct pair. m.mu is held.
func (m *Model) selector(q url.Values) (selector, error) {
	k := q.Get("labelSelector") + "\x00" + q.Get("fieldSelector")
	if s, ok := m.sels[k]; ok {
		return s, nil
	}
	ls, err := labels.Parse(q.Get("labelSelector"))
	if err != nil {
		return selector{}, err
	}
	fs, err := fields.ParseSelector(q.Get("fieldSelector"))
	if err != nil {
		return selector{}, err
	}
	sel := selector{ls, fs}
	m.sels[k] = sel
	return sel, nil
}

// matches reports whether o, stored under k, is selected.
func (s selector) matches(k key, o obj) bool {
	return s.labels.Matches(o.labels) && s.fields.Matches(fields.Set{"metadata.name": k.name, "metadata.namespace": k.ns})
}

func (m *Model) list(res, ns string, q url.Values, metadata bool) *http.Response {
	sel, err := m.selector(q)
	if err != nil {
		return statusResponse(http.StatusBadRequest, "BadRequest", err.Error())
	}
	var names []string
	for k, o := range m.objs {
		if k.res == res && k.ns == ns && sel.matches(k, o) {
			names = append(names, k.name)
		}
	}
	sort.Strings(names)
	kv := kinds[res]
	apiVersion, kind := kv[0], kv[1]+"List"
	if metadata {
		apiVersion, kind = "meta.k8s.io/v1", "PartialObjectMetadataList"
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"apiVersion":%q,"kind":%q,"metadata":{"resourceVersion":"%d"},"items":[`, apiVersion, kind, m.rv)
	for i, n := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		o := m.objs[key{res, ns, n}]
		if metadata {
			b.Write(o.metadata())
		} else {
			b.Write(o.raw)
		}
	}
	b.WriteString("]}")
	return rawResponse(http.StatusOK, b.Bytes())
}

// watch streams the changes after the request's resourceVersion (all
// current objects as ADDED first when it gives none) until the request
// ends, its timeoutSeconds pass, or the model closes. m.mu is held.
func (m *Model) watch(ctx context.Context, res, ns string, q url.Values) *http.Response {
	sel, err := m.selector(q)
	if err != nil {
		return statusResponse(http.StatusBadRequest, "BadRequest", err.Error())
	}
	var initial []event
	from := m.rv
	if rv := q.Get("resourceVersion"); rv != "" && rv != "0" {
		n, err := strconv.ParseInt(rv, 10, 64)
		if err != nil {
			return statusResponse(http.StatusBadRequest, "BadRequest", "resourceVersion: "+err.Error())
		}
		from = n
	} else {
		for k, o := range m.objs {
			if k.res == res && k.ns == ns && sel.matches(k, o) {
				initial = append(initial, event{typ: "ADDED", k: k, obj: o})
			}
		}
		sort.Slice(initial, func(i, j int) bool { return initial[i].rv < initial[j].rv })
	}
	timeout := time.Hour
	if s, err := strconv.Atoi(q.Get("timeoutSeconds")); err == nil && s > 0 {
		timeout = time.Duration(s) * time.Second
	}
	pr, pw := io.Pipe()
	go m.stream(ctx, pw, res, ns, sel, from, initial, timeout)
	resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}}, Body: pr, ContentLength: -1}
	return resp
}

func (m *Model) stream(ctx context.Context, pw *io.PipeWriter, res, ns string, sel selector, from int64, pending []event, timeout time.Duration) {
	defer func() { _ = pw.Close() }()
	end := time.NewTimer(timeout)
	defer end.Stop()
	for {
		for _, e := range pending {
			line := append(append([]byte(`{"type":"`+e.typ+`","object":`), e.raw...), "}\n"...)
			if _, err := pw.Write(line); err != nil {
				return
			}
		}
		m.mu.Lock()
		pending = pending[:0]
		for _, e := range m.events[sort.Search(len(m.events), func(i int) bool { return m.events[i].rv > from }):] {
			if e.k.res == res && e.k.ns == ns && sel.matches(e.k, e.obj) {
				pending = append(pending, e)
			}
			from = e.rv
		}
		changed := m.changed
		m.mu.Unlock()
		if len(pending) > 0 {
			continue
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		case <-end.C:
			return
		case <-m.closed:
			return
		}
	}
}

func metaOf(body map[string]any) map[string]any {
	if body == nil {
		return map[string]any{}
	}
	meta, ok := body["metadata"].(map[string]any)
	if !ok {
		meta = map[string]any{}
		body["metadata"] = meta
	}
	return meta
}

func setKind(res string, body map[string]any) {
	kv := kinds[res]
	body["apiVersion"], body["kind"] = kv[0], kv[1]
}

// mergePatch applies a JSON merge patch (RFC 7386).
func mergePatch(target, patch any) any {
	p, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	t, ok := target.(map[string]any)
	if !ok {
		t = map[string]any{}
	}
	for k, v := range p {
		if v == nil {
			delete(t, k)
			continue
		}
		t[k] = mergePatch(t[k], v)
	}
	return t
}

func deepCopy(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = deepCopy(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = deepCopy(e)
		}
		return out
	}
	return v
}

func jsonResponse(code int, v any) *http.Response {
	b, err := json.Marshal(v)
	if err != nil {
		return statusResponse(http.StatusInternalServerError, "InternalError", err.Error())
	}
	return rawResponse(code, b)
}

// rawResponse answers with the JSON b.
func rawResponse(code int, b []byte) *http.Response {
	return &http.Response{StatusCode: code, Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(bytes.NewReader(b)), ContentLength: int64(len(b))}
}

func statusResponse(code int, reason, msg string) *http.Response {
	b, _ := json.Marshal(map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": msg, "reason": reason, "code": code})
	return rawResponse(code, b)
}

func notFound(res, name string) *http.Response {
	return statusResponse(http.StatusNotFound, "NotFound", fmt.Sprintf("%s %q not found", res, name))
}

func conflict(res, name string) *http.Response {
	return statusResponse(http.StatusConflict, "Conflict", fmt.Sprintf("Operation cannot be fulfilled on %s %q: the object has been modified; please apply your changes to the latest version and try again", res, name))
}

// managed returns the managedFields of k after a write by manager at now:
// the stored object's, with manager's entry stamped now (whole seconds,
// as the API server stamps them). Recovery dates an uninstall from them.
func (m *Model) managed(k key, manager string, now time.Time) []any {
	var out []any
	if old, ok := m.objs[k]; ok {
		if mf, ok := metaOf(old.body)["managedFields"].([]any); ok {
			for _, e := range mf {
				if em, ok := e.(map[string]any); ok && em["manager"] != manager {
					out = append(out, em)
				}
			}
		}
	}
	return append(out, map[string]any{
		"manager": manager, "operation": "Update", "apiVersion": "v1",
		"time": now.UTC().Truncate(time.Second).Format(time.RFC3339), "fieldsType": "FieldsV1", "fieldsV1": map[string]any{},
	})
}
