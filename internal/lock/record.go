package lock

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/user"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SchemaVersion is the version of the Record schema this package writes.
//
// Compatibility rule: fields are only ever added within one schema version,
// and readers ignore fields they do not know, so a newer writer of the same
// schema stays readable. The number changes only when an existing field
// changes meaning; a reader that meets a higher number reports
// ErrUnsupportedSchema and judges the lock from the Lease spec alone
// (holderIdentity, renewTime, leaseDurationSeconds), which every schema keeps
// up to date.
const SchemaVersion = 1

// ErrUnsupportedSchema reports a lock record this version cannot read.
var ErrUnsupportedSchema = errors.New("unsupported lock record schema")

// Operation is the Helm operation a lock protects.
type Operation string

// The operations that take the lock.
const (
	OpInstall   Operation = "install"
	OpUpgrade   Operation = "upgrade"
	OpRollback  Operation = "rollback"
	OpUninstall Operation = "uninstall"
	// OpRecover is a recovery on its own (the recover command, embedders):
	// it writes no new revision, so nothing pending is ever attributed to it.
	OpRecover Operation = "recover"
)

func (o Operation) valid() bool {
	switch o {
	case OpInstall, OpUpgrade, OpRollback, OpUninstall, OpRecover:
		return true
	}
	return false
}

// Record says who holds (or last held) a release's lock. Times are estimates
// of the API server's clock (upper bounds at the moment the write was sent).
type Record struct {
	// The record's schema version, 1 (SchemaVersion of the writer). Readers
	// ignore unknown fields; a schema they do not know makes them judge
	// the lock from the Lease spec alone.
	Schema int `json:"schema"`
	// SESSION ID: a new UUID per operation; equals the Lease's
	// holderIdentity while the lock is held.
	Session string `json:"session"`
	// install, upgrade, rollback, uninstall (or recover: the recover
	// command and the controller).
	Operation Operation `json:"operation"`
	// The release.
	Release   string `json:"release"`
	Namespace string `json:"namespace"`
	// The release revision the holder is writing, once known (the latest
	// + 1; the latest for uninstall), then the newest one it created under
	// the lock (an upgrade's --rollback-on-failure creates the rollback's
	// after its own). On a copy of the lock on a release record written
	// with that record (helm's create or rewrite of it through the write
	// fence), that record's own revision.
	Revision int `json:"revision,omitempty"`
	// user@host, process ID and helm-autorecover version of the holder.
	Who         string `json:"who,omitempty"`
	PID         int    `json:"pid,omitempty"`
	ToolVersion string `json:"toolVersion,omitempty"`
	// The CI job that runs the holder, when one is detected (GitHub
	// Actions, GitLab CI, Jenkins, Buildkite, CircleCI, Travis, Drone,
	// Azure Pipelines), or HELM_AUTORECOVER_CI_JOB_URL (Tekton and others).
	CIJobURL string `json:"ciJobURL,omitempty"`
	// The --lock-backend the holder chose (lease or release); where this
	// copy of the record lives is the store's business.
	Backend string `json:"backend,omitempty"`
	// The operation's --timeout, informational: helm applies it per wait
	// and per hook, so an operation can last longer.
	Timeout metav1.Duration `json:"timeout"`
	// --lease-duration: how long the lock stays valid without renewal.
	LeaseDuration metav1.Duration `json:"leaseDuration"`
	// API-server time (the upper bound of the estimate at the moment of the
	// write) of the take and of the last renewal.
	AcquiredAt time.Time `json:"acquiredAt"`
	RenewedAt  time.Time `json:"renewedAt"`
	// The lower bound of the holder's estimate of API-server time when it
	// sent the write that stamped renewedAt (whole milliseconds, rounded
	// down): the server's clock read at least this then. renewedAt less
	// this is how uncertain the stamp is (a Date header is truncated to
	// its second, so up to a second and more for a fresh process). A
	// client that judges the lock on its own clock counts it in, up to a
	// second, before it takes a lock that server time still says is live
	// (Confirm), so that such a take never comes before the bound a holder
	// whose own clocks stood still stops by in the server's clock
	// (StopTill: LOCKED TILL, or sooner for a stamp more uncertain than
	// that). On the beat, key f.
	RenewedAfter time.Time `json:"renewedAfter,omitzero"`
	// LOCKED TILL = renewedAt + leaseDuration: the holder promises to have
	// stopped writing before the server clock reaches it unless it renews.
	LockedTill time.Time `json:"lockedTill"`
	// When the holder gives up renewing and aborts, however alive it is
	// (--lock-max-hold; zero: no limit).
	MaxHoldUntil time.Time `json:"maxHoldUntil,omitzero"`
	// Set when the lock was released; releasedBy names who released it
	// when that was not the holder itself.
	ReleasedAt time.Time `json:"releasedAt,omitzero"`
	ReleasedBy string    `json:"releasedBy,omitempty"`
	// The record of a holder that left a revision to recover: set on taking
	// over an expired lock until the revision is recovered (SetRevision and
	// Release clear it), kept by a holder that failed to recover it and
	// released (ReleaseAbandoning), and set by a person's unlock of a dead
	// holder (ForceRelease). The next client then recovers the revision at
	// once, as the failed holder would have, instead of taking a revision
	// pending under a released lock for stock helm's (legacy). It never
	// nests: it is the record of the holder that wrote the revision.
	Abandoned *Record `json:"abandoned,omitempty"`
	// On an abandoned holder's copy (Abandoned) only: set when that holder
	// is known to have stopped writing, because the client that took its
	// lock over confirmed its expiry on its own clock (Confirm), or the
	// holder released naming itself. Recovery then needs no wait for the
	// holder's LOCKED TILL, which its Date headers may have put minutes
	// ahead. Unset on a copy a person's unlock handed on, or one an
	// earlier version wrote: the holder may still write until its LOCKED
	// TILL, which recovery waits for.
	Stopped bool `json:"stopped,omitempty"`
	// On a release record's lock (the gate) only: the name of the small
	// object of the same kind in the same namespace where the holder renews
	// the lock and waiters queue (the beat). lockedTill on such a gate is a
	// bound for clients of earlier versions, which judge the record alone
	// (maxHoldUntil + leaseDuration, or renewedAt + 24h without a maximum
	// hold); those that know the beat judge it by renewedAt +
	// leaseDuration and the beat (see package releasestore).
	Liveness string `json:"liveness,omitempty"`
}

// Found returns what a lock taken from a holder with this record as found
// stands for, for recovery: the record and state themselves, unless the
// record names an abandoned holder (Abandoned) and either was released (a
// holder that failed to recover that holder's revision, or a person's
// unlock) or expired before it named a revision of its own (its holder died
// recovering); that abandoned holder then stands in as Expired.
func Found(rec *Record, state State) (*Record, State) {
	switch {
	case rec == nil || rec.Abandoned == nil:
	case state == Free:
		return rec.Abandoned, Expired
	case state == Expired && rec.Revision <= 0:
		// It died while recovering what the holder it names abandoned,
		// before it named a revision of its own.
		return rec.Abandoned, Expired
	}
	return rec, state
}

// HandedOn is the copy of the holder a lock taken from rec (found in state)
// names as abandoned (Record.Abandoned), nil when there is none: Found's,
// marked Stopped when this client confirmed that holder's expiry itself
// (rec was Expired and named no holder in its stead), or as it was marked
// when handed on to rec's holder.
func HandedOn(rec *Record, state State) *Record {
	p, st := Found(rec, state)
	if st != Expired || p == nil {
		return nil
	}
	a := *p
	a.Abandoned = nil
	if p == rec {
		a.Stopped = true
	}
	return &a
}

// Encode returns the record as the JSON stored in AnnotationRecord.
func (r *Record) Encode() (string, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return "", fmt.Errorf("encode lock record of release %q in namespace %q: %w", r.Release, r.Namespace, err)
	}
	return string(b), nil
}

// DecodeRecord parses a lock record. Unknown fields are ignored. A record of a
// newer schema is returned as far as it could be read, together with an error
// wrapping ErrUnsupportedSchema; callers may show it but must not judge expiry
// from it.
func DecodeRecord(s string) (*Record, error) {
	if r, ok := decoded.get(s); ok {
		return r, nil
	}
	var r Record
	if err := json.Unmarshal([]byte(s), &r); err != nil {
		return nil, fmt.Errorf("decode lock record: %w", err)
	}
	switch {
	case r.Schema == 0:
		return &r, fmt.Errorf("decode lock record: no schema field: %w", ErrUnsupportedSchema)
	case r.Schema < 0:
		return &r, fmt.Errorf("decode lock record: schema %d is not a schema: %w", r.Schema, ErrUnsupportedSchema)
	case r.Schema > SchemaVersion:
		return &r, fmt.Errorf("decode lock record: schema %d is newer than %d, upgrade helm-autorecover: %w", r.Schema, SchemaVersion, ErrUnsupportedSchema)
	}
	decoded.put(s, &r)
	return &r, nil
}

// decoded keeps the records DecodeRecord read last. A lock's record is read
// again at every step of a wait, once per part of a joint lock and again by
// the fence, and decoding its JSON was the largest share of the CPU a
// waiting client spent. Each caller gets its own copy.
var decoded recordMemo

// recordMemo maps a record's JSON to the record, for its last few entries.
type recordMemo struct {
	mu      sync.Mutex
	next    int
	entries [8]struct {
		s string
		r *Record
	}
}

func (m *recordMemo) get(s string) (*Record, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.entries {
		if e.r != nil && e.s == s {
			return e.r.clone(), true
		}
	}
	return nil, false
}

func (m *recordMemo) put(s string, r *Record) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.entries[m.next].s, m.entries[m.next].r = s, r.clone()
	m.next = (m.next + 1) % len(m.entries)
}

// clone returns a copy of r that shares nothing with it.
func (r *Record) clone() *Record {
	c := *r
	if r.Abandoned != nil {
		c.Abandoned = r.Abandoned.clone()
	}
	return &c
}

// NewSession returns a fresh session ID.
func NewSession() string { return uuid.NewString() }

// DefaultWho returns user@host for the current process.
func DefaultWho() string {
	name := ""
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	if name == "" {
		name = firstNonEmpty(os.Getenv("USER"), os.Getenv("USERNAME"), "unknown")
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return name + "@" + host
}

// EnvCIJobURL names a variable that, when set, overrides CI detection.
// Tekton sets no variable of its own: pass the run's dashboard URL through it,
// for example from $(context.pipelineRun.name).
const EnvCIJobURL = "HELM_AUTORECOVER_CI_JOB_URL"

// DetectCIJobURL returns the URL of the CI job the process runs in, or "".
// getenv is os.Getenv outside tests.
func DetectCIJobURL(getenv func(string) string) string {
	if u := getenv(EnvCIJobURL); u != "" {
		return u
	}
	// GitHub Actions.
	if id := getenv("GITHUB_RUN_ID"); id != "" && getenv("GITHUB_REPOSITORY") != "" {
		u := strings.TrimSuffix(firstNonEmpty(getenv("GITHUB_SERVER_URL"), "https://github.com"), "/") +
			"/" + getenv("GITHUB_REPOSITORY") + "/actions/runs/" + id
		if a := getenv("GITHUB_RUN_ATTEMPT"); a != "" && a != "1" {
			u += "/attempts/" + a
		}
		return u
	}
	// GitLab CI, Buildkite, CircleCI, Jenkins, Travis CI, Drone: each sets
	// the job's web URL directly.
	for _, k := range []string{"CI_JOB_URL", "BUILDKITE_BUILD_URL", "CIRCLE_BUILD_URL", "BUILD_URL", "TRAVIS_JOB_WEB_URL", "DRONE_BUILD_LINK"} {
		if u := getenv(k); u != "" {
			return u
		}
	}
	// Azure Pipelines.
	if c, p, id := getenv("SYSTEM_COLLECTIONURI"), getenv("SYSTEM_TEAMPROJECT"), getenv("BUILD_BUILDID"); c != "" && p != "" && id != "" {
		return strings.TrimSuffix(c, "/") + "/" + url.PathEscape(p) + "/_build/results?buildId=" + url.QueryEscape(id)
	}
	return ""
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// SameHolder tells whether two encodings of a lock record name the same
// holder in the same state: the same session, released or not alike (a
// renewal changes neither). Two unreadable or absent records are the same
// only when equal.
func SameHolder(a, b string) bool {
	if a == b {
		return true
	}
	ra, errA := DecodeRecord(a)
	rb, errB := DecodeRecord(b)
	if errA != nil || errB != nil || ra == nil || rb == nil {
		return false
	}
	return ra.Session == rb.Session && ra.ReleasedAt.Equal(rb.ReleasedAt) && ra.ReleasedBy == rb.ReleasedBy
}

// UnreadableHolder stands for the holder of a lock record that is not JSON
// at all: the lock is judged Live (its expiry cannot be told) until someone
// unlocks it with --force naming this session.
const UnreadableHolder = "unreadable-lock-record"

// AnnotatedRecord is the lock record in annotations as far as it can be
// read (a newer schema's too, see DecodeRecord), nil when there is none.
func AnnotatedRecord(annotations map[string]string) *Record {
	raw, ok := annotations[AnnotationRecord]
	if !ok {
		return nil
	}
	rec, _ := DecodeRecord(raw)
	return rec
}

// SessionOf is the session of a gate record read as far as it could be
// (a newer schema's), "" when none.
func SessionOf(rec *Record) string {
	if rec == nil {
		return ""
	}
	return rec.Session
}
