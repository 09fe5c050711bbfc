package helmx

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"helm.sh/helm/v4/pkg/release/common"
	rspb "helm.sh/helm/v4/pkg/release/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/lock/releasestore"
	"github.com/helm-autorecover/helm-autorecover/internal/records"
)

// The layout of Helm's "secret" storage driver, which Helm 3 and Helm 4 share.
// Each revision is one Secret; its data["release"] holds the release as JSON,
// gzip-compressed, then base64-encoded as text (on top of the base64 the API
// itself applies to Secret data).
const (
	// ReleaseSecretType is the Secret type Helm gives every release revision.
	ReleaseSecretType corev1.SecretType = "helm.sh/release.v1"
	// ReleaseDataKey is the Secret data key that holds the encoded release.
	ReleaseDataKey = records.DataKey

	// The storage labels Helm sets on every revision Secret.
	LabelName       = "name"
	LabelOwner      = "owner"
	LabelStatus     = "status"
	LabelVersion    = records.LabelVersion
	LabelCreatedAt  = "createdAt"
	LabelModifiedAt = "modifiedAt"
	// OwnerHelm is the value of LabelOwner on Helm's storage Secrets.
	OwnerHelm = "helm"
)

// maxReleaseJSON bounds decompression. A Secret holds at most 1 MiB, and
// release JSON compresses about tenfold, so this leaves a wide margin while
// keeping a hostile payload from exhausting memory.
const maxReleaseJSON = 128 << 20

// gzipMagic opens every gzip stream. Helm only decompresses payloads that
// start with it (releases from before compression are plain JSON), and so do we.
var gzipMagic = []byte{0x1f, 0x8b, 0x08}

// ReleaseSecretName is the name of the Secret holding revision rev of release.
func ReleaseSecretName(release string, rev int) string {
	return "sh.helm.release.v1." + release + ".v" + strconv.Itoa(rev)
}

// HistorySelector is the label selector matching every stored revision of release.
func HistorySelector(release string) string {
	return LabelOwner + "=" + OwnerHelm + "," + LabelName + "=" + release
}

// gzipWriters and gzipReaders keep gzip state for reuse: a writer's tables
// alone are about 700 KB, allocated and cleared for every record otherwise.
var (
	gzipWriters = sync.Pool{New: func() any {
		zw, err := gzip.NewWriterLevel(nil, gzip.BestCompression)
		if err != nil {
			panic(fmt.Sprintf("gzip writer at the best compression: %v", err))
		}
		return zw
	}}
	gzipReaders sync.Pool
)

// DecodeReleaseJSON turns a stored data["release"] value back into the
// release's JSON document. The payload may be gzip-compressed or not, as Helm
// accepts both. The document is returned as raw bytes so that fields this
// program (or this Helm version) does not know are kept exactly.
func DecodeReleaseJSON(data []byte) (json.RawMessage, error) {
	raw := make([]byte, base64.StdEncoding.DecodedLen(len(data)))
	n, err := base64.StdEncoding.Decode(raw, data)
	if err != nil {
		return nil, fmt.Errorf("decoding the release payload: not base64 text: %w", err)
	}
	raw = raw[:n]
	if bytes.HasPrefix(raw, gzipMagic) {
		zr, _ := gzipReaders.Get().(*gzip.Reader)
		if zr == nil {
			zr = new(gzip.Reader)
		}
		defer gzipReaders.Put(zr)
		if err := zr.Reset(bytes.NewReader(raw)); err != nil {
			return nil, fmt.Errorf("decoding the release payload: bad gzip header: %w", err)
		}
		raw, err = io.ReadAll(io.LimitReader(zr, maxReleaseJSON+1))
		if err != nil {
			return nil, fmt.Errorf("decoding the release payload: bad gzip stream: %w", err)
		}
		if len(raw) > maxReleaseJSON {
			return nil, fmt.Errorf("decoding the release payload: it expands beyond %d bytes", maxReleaseJSON)
		}
	}
	if err := checkObject(raw); err != nil {
		return nil, fmt.Errorf("decoding the release payload: %w", err)
	}
	return json.RawMessage(raw), nil
}

// EncodeReleaseJSON turns a release JSON document into the value Helm stores
// in data["release"]: base64 text of the gzip-compressed JSON, which every
// Helm 3 and Helm 4 release reads.
func EncodeReleaseJSON(doc json.RawMessage) ([]byte, error) {
	if err := checkObject(doc); err != nil {
		return nil, fmt.Errorf("encoding the release payload: %w", err)
	}
	var buf bytes.Buffer
	zw := gzipWriters.Get().(*gzip.Writer)
	defer gzipWriters.Put(zw)
	zw.Reset(&buf)
	if _, err := zw.Write(doc); err != nil {
		return nil, fmt.Errorf("encoding the release payload: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("encoding the release payload: %w", err)
	}
	out := make([]byte, base64.StdEncoding.EncodedLen(buf.Len()))
	base64.StdEncoding.Encode(out, buf.Bytes())
	return out, nil
}

// SetInfoFields returns doc with the given keys of its "info" object set to
// the given values. Every other value, at any depth, is carried over as it
// was, including fields unknown to Helm's Go types: stock Helm drops those
// when it rewrites a release, and we must not. A key equal but for case
// to one set ("STATUS" beside "status") is set too: helm matches keys
// without regard to case and takes the one that sorts last (see
// releaseHeader), so every reader reads the value set. Two keys of set
// equal but for case are an error.
func SetInfoFields(doc json.RawMessage, set map[string]any) (json.RawMessage, error) {
	for k := range set {
		for k2 := range set {
			if k < k2 && strings.EqualFold(k, k2) {
				return nil, fmt.Errorf("editing the release: info.%s and info.%s are one field to helm", k, k2)
			}
		}
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(doc, &top); err != nil {
		return nil, fmt.Errorf("editing the release: not a JSON object: %w", err)
	}
	if top == nil {
		return nil, errors.New("editing the release: the document is null")
	}
	info := map[string]json.RawMessage{}
	if rawInfo, ok := top["info"]; ok && !bytes.Equal(bytes.TrimSpace(rawInfo), []byte("null")) {
		if err := json.Unmarshal(rawInfo, &info); err != nil {
			return nil, fmt.Errorf("editing the release: its info is not a JSON object: %w", err)
		}
	}
	for k, v := range set {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("editing the release: info.%s: %w", k, err)
		}
		info[k] = b
		for other := range info {
			if other != k && strings.EqualFold(other, k) {
				info[other] = b
			}
		}
	}
	b, err := json.Marshal(info)
	if err != nil {
		return nil, fmt.Errorf("editing the release: %w", err)
	}
	top["info"] = b
	out, err := json.Marshal(top)
	if err != nil {
		return nil, fmt.Errorf("editing the release: %w", err)
	}
	return out, nil
}

// KeyLeft is the top-level key of the release JSON under which recovery
// records, on a revision it marked failed, the objects only that revision
// rendered that it left in place for the next operation to settle
// (recovery.LoadLeft). Helm ignores keys it does not know when it reads a
// release, and drops them when it rewrites one (a rollback marks the failed
// revision superseded): by then a newer revision supersedes the record.
const KeyLeft = "helm_autorecover_left"

// SetTopField returns doc with its top-level key set to value; every other
// value is carried over as it was (see SetInfoFields).
func SetTopField(doc json.RawMessage, key string, value any) (json.RawMessage, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(doc, &top); err != nil {
		return nil, fmt.Errorf("editing the release: not a JSON object: %w", err)
	}
	if top == nil {
		return nil, errors.New("editing the release: the document is null")
	}
	b, err := json.Marshal(value)
	if err != nil {
		return nil, fmt.Errorf("editing the release: %s: %w", key, err)
	}
	top[key] = b
	out, err := json.Marshal(top)
	if err != nil {
		return nil, fmt.Errorf("editing the release: %w", err)
	}
	return out, nil
}

func checkObject(doc []byte) error {
	// JSON's own white space only: bytes.TrimSpace also drops Unicode
	// spaces (U+0085, U+00A0), which no JSON decoder, helm's included,
	// accepts before a document.
	trimmed := bytes.Trim(doc, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' || !json.Valid(trimmed) {
		return errors.New("not a JSON object")
	}
	return nil
}

// Summary is what recovery needs to know about one stored revision, read
// without decoding the chart, values or manifest into Helm's types.
type Summary struct {
	// RecordKind, RecordName and RecordNamespace locate the stored record:
	// a Secret (helm's default driver) or a ConfigMap (HELM_DRIVER=configmap).
	RecordKind      string
	RecordName      string
	RecordNamespace string

	Name         string // release name
	Namespace    string // release namespace (the Secret's when the JSON has none)
	Revision     int
	Status       common.Status
	Description  string
	ChartName    string
	ChartVersion string
	// FirstDeployed and LastDeployed are written by the client that ran the
	// operation, in its own clock: display only, never for judging age.
	FirstDeployed time.Time
	LastDeployed  time.Time

	// CreationTimestamp is set by the API server when the Secret was created
	// (whole seconds, server clock).
	CreationTimestamp time.Time
	// LastWriteTime is the latest managedFields timestamp: the API server sets
	// it, in its own clock, whenever a write changes the Secret. Zero when the
	// Secret carries no managedFields.
	LastWriteTime time.Time
	// ResourceVersion is the version read; every write back is conditional on it.
	ResourceVersion string
	// ContentHash digests the release payload and the labels: two reads of a
	// record with the same hash hold the same release, whatever happened to
	// its annotations (where the lock lives) in between.
	ContentHash string

	// LockSession and LockAbandoned are the sessions the record's own lock
	// annotation (lock.AnnotationRecord) names: its holder, and the holder
	// it names as abandoned (lock.Record.Abandoned). Empty when the record
	// carries no readable lock. Recovery attributes a pending revision to a
	// holder only when the revision's record names that holder (see
	// recovery.Decide, rule 4): a holder's fenced create writes its lock
	// into the record, stock helm's never does, and a takeover names the
	// holder it found in the record it took.
	LockSession, LockAbandoned string

	// Left is the raw value of the release's KeyLeft, nil when it has
	// none: the objects recovery left in place when it marked this
	// revision failed (recovery.LoadLeft reads it).
	Left string

	// LockRevision is the revision the record's own lock annotation names
	// for its holder (LockSession), 0 when none. The write fence's create
	// and rewrite of a revision's record name that very revision there, so
	// a record whose lock names its own revision was written by that
	// holder, whatever revision the holder's lock named elsewhere (an
	// upgrade's --rollback-on-failure writes a second revision under one
	// lock; see recovery.Decide, rule 4).
	LockRevision int
}

// CarriesLockOf reports whether the record's own lock annotation names
// session, as its holder or as the holder it names abandoned.
func (s Summary) CarriesLockOf(session string) bool {
	return session != "" && (s.LockSession == session || s.LockAbandoned == session)
}

// releaseHeader holds the few release fields Summarize reads. Its info is
// helm's own type, decoded by helm's own code: helm reads info through a
// map (to accept the empty strings it once wrote for unset times) and so
// in sorted key order, not in document order, and an object holding keys
// equal but for case ("status" and "STATUS") gives the value of the key
// that sorts last. Any other reading could see another status than helm's
// operations see (TestSummarizeReadsFoldedKeysAsHelm, FuzzDecodeReleasePayload).
type releaseHeader struct {
	Left      json.RawMessage `json:"helm_autorecover_left"`
	Name      string          `json:"name"`
	Namespace string          `json:"namespace"`
	Version   int             `json:"version"`
	Info      *rspb.Info      `json:"info"`
	Chart     *struct {
		Metadata *struct {
			Name    string `json:"name"`
			Version string `json:"version"`
		} `json:"metadata"`
	} `json:"chart"`
}

// Summarize reads the summary of the release revision stored in secret.
func Summarize(secret *corev1.Secret) (Summary, error) {
	if secret == nil {
		return Summary{}, errors.New("summarizing a release revision: no Secret given")
	}
	return SummarizeRecord(SecretRecord(secret))
}

// SummarizeRecord reads the summary of the release revision stored in r.
func SummarizeRecord(r Record) (Summary, error) {
	where := r.Describe()
	if sec := r.Secret(); sec != nil && sec.Type != ReleaseSecretType && sec.Type != "" {
		return Summary{}, fmt.Errorf("%s has type %q, not a Helm release (%q)", where, sec.Type, ReleaseSecretType)
	}
	if !r.HasPayload() {
		return Summary{}, fmt.Errorf("%s has no %q data key; it is not a Helm release revision", where, ReleaseDataKey)
	}
	doc, err := DecodeReleaseJSON(r.Payload)
	if err != nil {
		return Summary{}, fmt.Errorf("reading %s: %w", where, err)
	}
	var h releaseHeader
	if err := json.Unmarshal(doc, &h); err != nil {
		return Summary{}, fmt.Errorf("reading %s: the release JSON does not match Helm's layout: %w", where, err)
	}

	s := summarizeMeta(r)
	s.ContentHash = contentHash(r)
	if len(h.Left) > 0 && string(h.Left) != "null" {
		s.Left = string(h.Left)
	}
	s.Name = cmp.Or(h.Name, s.Name)
	s.Namespace = cmp.Or(h.Namespace, s.Namespace)
	if h.Version != 0 {
		s.Revision = h.Version
	}
	if h.Info != nil {
		s.Status = h.Info.Status
		s.Description = h.Info.Description
		s.FirstDeployed, s.LastDeployed = h.Info.FirstDeployed, h.Info.LastDeployed
	}
	if h.Chart != nil && h.Chart.Metadata != nil {
		s.ChartName = h.Chart.Metadata.Name
		s.ChartVersion = h.Chart.Metadata.Version
	}
	return s, nil
}

// summarizeMeta is what a record's metadata tells of its revision: where it
// is, the release and revision its labels name (unparseable labels leave
// the revision 0, which callers treat as unknown), the server-set times, and
// the lock it carries.
func summarizeMeta(r Record) Summary {
	s := Summary{
		RecordKind:        r.Kind,
		RecordName:        r.Meta.Name,
		RecordNamespace:   r.Meta.Namespace,
		Name:              r.Meta.Labels[LabelName],
		Namespace:         r.Meta.Namespace,
		CreationTimestamp: r.Meta.CreationTimestamp.Time,
		ResourceVersion:   r.Meta.ResourceVersion,
		Revision:          records.RevisionOf(r.Meta.Labels),
	}
	s.LockSession, s.LockAbandoned, s.LockRevision = lockSessions(r.Meta.Annotations[lock.AnnotationRecord])
	for _, mf := range r.Meta.ManagedFields {
		if mf.Manager == releasestore.FieldManager {
			continue // a lock write, not a change of the release
		}
		if mf.Time != nil && mf.Time.After(s.LastWriteTime) {
			s.LastWriteTime = mf.Time.Time
		}
	}
	return s
}

// SummarizeMeta reads the summary of a revision from its record's metadata
// alone (records.Store.ListMeta): the status and revision from the labels
// helm's storage drivers keep in step with the release, and no description,
// chart or content hash. ok is false when the labels do not name a status
// and a revision; read the whole record then.
func SummarizeMeta(r Record) (s Summary, ok bool) {
	s = summarizeMeta(r)
	s.Status = common.Status(r.Meta.Labels[LabelStatus])
	return s, s.Revision > 0 && s.Status != "" && s.Status != common.StatusUnknown
}

// lockSessions reads the sessions a record's lock annotation names (its
// holder, and the holder it names abandoned) and the revision it names for
// its holder; an absent or unreadable annotation names none.
func lockSessions(annotation string) (holder, abandoned string, revision int) {
	if annotation == "" {
		return "", "", 0
	}
	// A record of a newer schema still names its sessions (see
	// lock.DecodeRecord); only expiry may not be judged from it.
	rec, _ := lock.DecodeRecord(annotation)
	if rec == nil {
		return "", "", 0
	}
	if rec.Abandoned != nil {
		abandoned = rec.Abandoned.Session
	}
	return rec.Session, abandoned, rec.Revision
}

// contentHash digests what makes a record a release revision: its payload
// and its labels.
func contentHash(r Record) string {
	h := sha256.New()
	h.Write(r.Payload)
	keys := slices.Sorted(maps.Keys(r.Meta.Labels))
	for _, k := range keys {
		fmt.Fprintf(h, "\x00%s=%s", k, r.Meta.Labels[k])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// HookRef names an object one of a revision's hooks creates, as the
// revision's record lists it.
type HookRef struct {
	Kind      string
	Namespace string
	Name      string
	// GenerateName is the manifest's metadata.generateName, for a hook
	// with no name of its own: the API server names each object it
	// creates from it.
	GenerateName string
}

// ReleaseHooks reads the hooks of the revision stored in r: the kind and
// name helm recorded for each, and the namespace its manifest names, or ns
// (the release's) when it names none, as helm creates it. Hooks carry none
// of the ownership annotations helm gives the release's other objects:
// the revision's record is what ties them to it.
func ReleaseHooks(r Record, ns string) ([]HookRef, error) {
	doc, err := DecodeReleaseJSON(r.Payload)
	if err != nil {
		return nil, fmt.Errorf("reading the hooks of %s: %w", r.Describe(), err)
	}
	var rel struct {
		Hooks []*rspb.Hook `json:"hooks"`
	}
	if err := json.Unmarshal(doc, &rel); err != nil {
		return nil, fmt.Errorf("reading the hooks of %s: %w", r.Describe(), err)
	}
	var out []HookRef
	for _, h := range rel.Hooks {
		if h == nil {
			continue
		}
		ref := HookRef{Kind: h.Kind, Namespace: ns, Name: h.Name}
		var m struct {
			Metadata struct {
				Name         string `json:"name"`
				GenerateName string `json:"generateName"`
				Namespace    string `json:"namespace"`
			} `json:"metadata"`
		}
		// helm names the hook after its manifest's metadata.name; an
		// unreadable manifest keeps the recorded name.
		if yaml.Unmarshal([]byte(h.Manifest), &m) == nil {
			ref.Name = cmp.Or(m.Metadata.Name, ref.Name)
			ref.GenerateName = m.Metadata.GenerateName
			ref.Namespace = cmp.Or(m.Metadata.Namespace, ns)
		}
		out = append(out, ref)
	}
	return out, nil
}

// ReadHistory reads every stored revision of release in namespace ns straight
// from helm's records (Secrets or ConfigMaps, as recs says), oldest first,
// each with its resourceVersion. Errors name the release, the namespace and,
// for an unreadable revision, the record to inspect.
func ReadHistory(ctx context.Context, recs Records, ns, release string) ([]Summary, error) {
	list, _, err := recs.List(ctx, ns, HistorySelector(release))
	if err != nil {
		return nil, fmt.Errorf("release %q in namespace %q: reading its history: %w", release, ns, err)
	}
	newest, _ := records.NewestOf(list)
	out := make([]Summary, 0, len(list))
	for _, r := range list {
		s, err := SummarizeRecord(r)
		switch {
		case err == nil:
			out = append(out, s)
		case r.Meta.Name == newest.Meta.Name:
			// The newest record may carry a live holder's lock: nothing is
			// decided past it.
			return nil, fmt.Errorf("release %q in namespace %q: its newest record is unreadable: %w; inspect it with: %s",
				release, ns, err, recs.ReadCommand(ns, r.Meta.Name))
		default:
			// helm's own storage skips a record it cannot decode; so does
			// the history, saying which.
			slog.Warn("helm-autorecover: skipping an unreadable record labelled as a revision of the release, as helm does",
				slog.String("release", release), slog.String("namespace", ns), slog.String("record", recs.Kind()+"/"+r.Meta.Name), slog.Any("error", err))
		}
	}
	slices.SortFunc(out, func(a, b Summary) int { return a.Revision - b.Revision })
	return out, nil
}
