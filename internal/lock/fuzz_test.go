package lock

import (
	"errors"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/records"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// Fuzz targets for the lock's decoders and its judgement (issue 14). Each
// checks what the code and docs/protocol.md promise, not only that nothing
// panics. `make fuzz` runs every one of them for $(FUZZ_TIME); the seeds
// below and in testdata/fuzz run as plain unit tests.
//
// Times are offsets from fzT0 in int32 milliseconds (about ±24 days), and
// lease durations are bounded by MaxLeaseDuration, as every writer's are:
// the properties are about the protocol, not about time.Time overflow.

var fzT0 = time.Date(2026, 3, 14, 15, 9, 26, 0, time.UTC)

func fzAt(ms int64) time.Time { return fzT0.Add(time.Duration(ms) * time.Millisecond) }

// fzBounds is a server-time estimate starting at ms, width wide.
func fzBounds(ms int64, width uint16) servertime.Bounds {
	e := fzAt(ms)
	return servertime.Bounds{Earliest: e, Latest: e.Add(time.Duration(width) * time.Millisecond)}
}

// fzLease maps any number onto a lease duration a holder may ask for:
// longer than twice RenewMargin, at most MaxLeaseDuration, whole
// milliseconds.
func fzLease(ms uint32) time.Duration {
	lo, hi := 2*RenewMargin+time.Millisecond, MaxLeaseDuration
	return lo + time.Duration(int64(ms)%int64((hi-lo)/time.Millisecond+1))*time.Millisecond
}

func fzOp(b byte) Operation {
	ops := []Operation{OpInstall, OpUpgrade, OpRollback, OpUninstall, OpRecover}
	return ops[int(b)%len(ops)]
}

// fzText is s as JSON carries it: encoding/json replaces invalid UTF-8.
func fzText(s, orElse string) string {
	if s = strings.ToValidUTF8(s, "\uFFFD"); s == "" {
		return orElse
	}
	return s
}

// fzRelease is r when it is a legal release name, else "web".
func fzRelease(r string) string {
	if ValidateReleaseName(r) != nil {
		return "web"
	}
	return r
}

func sampleRecordJSON(t testing.TB) []string {
	r := Record{
		Schema: SchemaVersion, Session: "5d1f2b7c-8a3e-4f0a-9c1d-2e3f4a5b6c7d", Operation: OpUpgrade, Release: "web", Namespace: "prod",
		Revision: 7, Who: "alice@laptop", PID: 4242, ToolVersion: "v1.2.3", CIJobURL: "https://ci.example/job/1", Backend: "release",
		Timeout: metav1.Duration{Duration: 5 * time.Minute}, LeaseDuration: metav1.Duration{Duration: 15 * time.Second},
		AcquiredAt: fzAt(0), RenewedAt: fzAt(5000), LockedTill: fzAt(20000), MaxHoldUntil: fzAt(3600000),
	}
	gate := gateForm(r)
	released := r
	released.ReleasedAt, released.ReleasedBy = fzAt(9000), "bob@desk"
	taken := r
	taken.Session, taken.Revision = "046b", 0
	taken.Abandoned = &Record{Schema: SchemaVersion, Session: r.Session, Operation: OpUpgrade, Revision: 7, LockedTill: r.LockedTill}
	var out []string
	for _, rec := range []Record{r, gate, released, taken} {
		s, err := rec.Encode()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// FuzzDecodeRecord: DecodeRecord either fails, or returns a record that
// re-encodes to a fixpoint; a record of an unknown schema is returned with
// ErrUnsupportedSchema (shown, never judged), any other failure returns no
// record. The Lease spec a record stands for (SpecOf) names its holder, or
// none once released, and never ends before renewedAt + leaseDuration.
// Found hands on only the abandoned holder a record names.
func FuzzDecodeRecord(f *testing.F) {
	for _, s := range sampleRecordJSON(f) {
		f.Add(s)
	}
	for _, s := range []string{
		"", "null", "{}", "nope", `{"schema":1}`, `{"schema":2,"session":"s","lockedTill":"2026-03-14T15:09:46Z"}`,
		`{"session":"s"}`, `{"schema":1,"session":"s","leaseDuration":"1.5s","renewedAt":"2026-03-14T15:09:26.123456789+02:00"}`,
		`{"schema":1,"session":"s","abandoned":{"schema":1,"session":"t","abandoned":{"session":"u"}}}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		rec, err := DecodeRecord(s)
		unsupported := errors.Is(err, ErrUnsupportedSchema)
		switch {
		case err == nil && rec == nil:
			t.Fatalf("DecodeRecord(%q) = nil, nil", s)
		case err != nil && !unsupported && rec != nil:
			t.Fatalf("DecodeRecord(%q) returned a half-read record %+v with %v", s, rec, err)
		case unsupported && rec == nil:
			t.Fatalf("DecodeRecord(%q): a record of an unknown schema must be returned to show: %v", s, err)
		case err == nil && (rec.Schema <= 0 || rec.Schema > SchemaVersion):
			t.Fatalf("DecodeRecord(%q) accepted schema %d without ErrUnsupportedSchema", s, rec.Schema)
		case unsupported && rec.Schema > 0 && rec.Schema <= SchemaVersion:
			t.Fatalf("DecodeRecord(%q) refused schema %d: %v", s, rec.Schema, err)
		}

		spec := SpecOf(s)
		if rec == nil {
			if s != "" && HolderOf(&spec) != UnreadableHolder {
				t.Fatalf("SpecOf(%q): an unreadable record must name the unreadable holder (judged live), got %q", s, HolderOf(&spec))
			}
			return
		}

		enc, err2 := rec.Encode()
		if err2 != nil {
			t.Fatalf("a decoded record does not encode again: %v (record %+v)", err2, rec)
		}
		again, err3 := DecodeRecord(enc)
		if (err3 == nil) != (err == nil) || errors.Is(err3, ErrUnsupportedSchema) != unsupported {
			t.Fatalf("DecodeRecord(Encode(DecodeRecord(%q))) = %v, first read %v", s, err3, err)
		}
		if enc2, _ := again.Encode(); enc2 != enc {
			t.Fatalf("not a fixpoint:\n %s\n %s", enc, enc2)
		}

		// The spec mirror (SpecOf): the holder, or none once released.
		wantHolder := rec.Session
		if !rec.ReleasedAt.IsZero() {
			wantHolder = ""
		}
		if got := HolderOf(&spec); got != wantHolder {
			t.Fatalf("SpecOf names holder %q, want %q (record %s)", got, wantHolder, enc)
		}
		d := rec.LeaseDuration.Duration
		if wantHolder != "" && d > 0 && !rec.RenewedAt.IsZero() {
			if spec.LeaseDurationSeconds == nil || spec.RenewTime == nil || !spec.RenewTime.Time.Equal(rec.RenewedAt) {
				t.Fatalf("SpecOf(%s) = %+v: renewTime and leaseDurationSeconds must mirror the record", enc, spec)
			}
			secs := *spec.LeaseDurationSeconds
			// Rounded up, so a reader of the spec alone (a newer schema)
			// never takes the lock before the holder's renewedAt + lease.
			// Checked up to 1000h: float64 seconds lose a nanosecond
			// beyond about 97 days, far past any lease.
			if secs < 1 || (d <= 1000*time.Hour && time.Duration(secs)*time.Second < d) {
				t.Fatalf("SpecOf: leaseDurationSeconds %d shortens the record's lease %s", secs, d)
			}
		}

		// Found hands on only the abandoned holder the record names, and
		// HandedOn marks it stopped only when this client found the holder
		// Expired itself.
		for _, st := range []State{Free, Live, Expired} {
			got, gst := Found(rec, st)
			if h := HandedOn(rec, st); (h != nil) != (gst == Expired && got != nil) ||
				(h != nil && h.Stopped != (got == rec || got.Stopped)) || (h != nil && h.Abandoned != nil) {
				t.Fatalf("HandedOn(record, %s) = %+v; Found gave %p %s", st, h, got, gst)
			}
			switch {
			case got == rec && gst == st:
			case got == rec.Abandoned && got != nil && gst == Expired && (st == Free || (st == Expired && rec.Revision <= 0)):
			default:
				t.Fatalf("Found(record, %s) = %p %s; record %p, abandoned %p", st, got, gst, rec, rec.Abandoned)
			}
		}
	})
}

// FuzzRecordRoundTrip: every form in which the lock writes a record reads
// back as written: the record (Encode/DecodeRecord), its gate form on a
// release record (with a bound for earlier clients never shorter than the
// holder's LOCKED TILL, and undone by gateEffective), its beat (short keys,
// Unix milliseconds), and the waiters' queues. A record the holder
// stamped is never judged expired before its LOCKED TILL plus the margin,
// from the record with its spec or from the spec alone.
func FuzzRecordRoundTrip(f *testing.F) {
	f.Add("5d1f2b7c-8a3e-4f0a-9c1d-2e3f4a5b6c7d", "alice@laptop", "web", "prod", byte(1), 7, 4242, int32(0), uint16(300), uint32(15000), uint32(3600000), int32(0), "", false, int32(1000))
	f.Add("s", "", "my.release-1", "default", byte(3), 0, 0, int32(-86400000), uint16(0), uint32(0), uint32(0), int32(5000), "ops@desk", true, int32(0))
	f.Add("046b", "ci@runner-7", strings.Repeat("a", 53), "kube-system", byte(4), 12, 1, int32(123456), uint16(999), uint32(599999), uint32(1), int32(1), "", true, int32(-5000))
	f.Fuzz(func(t *testing.T, session, who, release, ns string, op byte, rev, pid int, takeMs int32, widthMs uint16, leaseMs, maxHoldMs uint32, releasedAfterMs int32, releasedBy string, abandoned bool, renewAfterMs int32) {
		req := Request{
			Release: fzRelease(release), Namespace: fzText(ns, "default"), Operation: fzOp(op), Revision: max(rev, 0),
			Session: fzText(session, "s"), Who: fzText(who, ""), PID: pid, ToolVersion: "v0.1.0", Backend: "release",
			Timeout: 5 * time.Minute, LeaseDuration: fzLease(leaseMs), MaxHold: time.Duration(maxHoldMs) * time.Millisecond,
		}
		rec := newRecord(&req, fzBounds(int64(takeMs), widthMs))
		stamp(&rec, fzBounds(int64(takeMs)+int64(renewAfterMs), widthMs)) // a renewal, possibly with a clock that went back
		if !rec.LockedTill.Equal(rec.RenewedAt.Add(rec.LeaseDuration.Duration)) || rec.RenewedAt.Before(rec.AcquiredAt) {
			t.Fatalf("stamp: renewedAt %s, lockedTill %s, acquiredAt %s, lease %s", rec.RenewedAt, rec.LockedTill, rec.AcquiredAt, rec.LeaseDuration)
		}
		if abandoned {
			prev := newRecord(&Request{Session: "dead-" + req.Session, Operation: OpUpgrade, Release: req.Release, Namespace: req.Namespace, Revision: req.Revision + 1, LeaseDuration: DefaultLeaseDuration}, fzBounds(int64(takeMs)-60000, widthMs))
			rec.Abandoned = &prev
		}
		if releasedAfterMs > 0 {
			rec.ReleasedAt = ceilMilli(fzAt(int64(takeMs) + int64(releasedAfterMs)))
			rec.ReleasedBy = fzText(releasedBy, "")
		}

		// The record.
		enc, err := rec.Encode()
		if err != nil {
			t.Fatal(err)
		}
		back, err := DecodeRecord(enc)
		if err != nil || !reflect.DeepEqual(*back, rec) {
			t.Fatalf("record round trip (%v):\n got %+v\nwant %+v", err, back, rec)
		}

		// Its gate form.
		gate := gateForm(rec)
		genc, err := gate.Encode()
		if err != nil {
			t.Fatal(err)
		}
		gback, err := DecodeRecord(genc)
		if err != nil || !reflect.DeepEqual(*gback, gate) {
			t.Fatalf("gate round trip (%v):\n got %+v\nwant %+v", err, gback, gate)
		}
		if gate.Liveness != LeaseName(rec.Release) {
			t.Fatalf("gate names beat %q, want %q", gate.Liveness, LeaseName(rec.Release))
		}
		if rec.ReleasedAt.IsZero() && gate.LockedTill.Before(rec.LockedTill) {
			t.Fatalf("the gate's bound for earlier clients %s is before the holder's LOCKED TILL %s", gate.LockedTill, rec.LockedTill)
		}
		Stores.GateEffective(gback)
		if rec.ReleasedAt.IsZero() && !gback.LockedTill.Equal(rec.LockedTill) {
			t.Fatalf("gateEffective: LOCKED TILL %s, want the holder's %s", gback.LockedTill, rec.LockedTill)
		}

		// Its beat.
		benc, err := encodeBeat(rec)
		if err != nil {
			t.Fatal(err)
		}
		bt := decodeBeat(benc, rec.Release, rec.Namespace)
		want := &Record{
			Schema: SchemaVersion, Session: rec.Session, Operation: rec.Operation, Release: rec.Release, Namespace: rec.Namespace,
			Revision: rec.Revision, Who: rec.Who, LeaseDuration: rec.LeaseDuration, AcquiredAt: rec.AcquiredAt, RenewedAt: rec.RenewedAt, RenewedAfter: rec.RenewedAfter,
			LockedTill: rec.LockedTill, ReleasedAt: rec.ReleasedAt, ReleasedBy: rec.ReleasedBy,
		}
		if !reflect.DeepEqual(bt, want) {
			t.Fatalf("beat round trip of %s:\n got %+v\nwant %+v", benc, bt, want)
		}

		// The queues (the Lease's, and the beat's compact one).
		ws := []Waiter{
			{Session: rec.Session, Who: rec.Who, Operation: rec.Operation, EnqueuedAt: rec.AcquiredAt, HeartbeatAt: rec.RenewedAt, ExpiresAt: rec.LockedTill},
			{Session: "w2", EnqueuedAt: rec.RenewedAt, ExpiresAt: rec.RenewedAt.Add(DefaultLeaseDuration)},
		}
		qenc, err := EncodeQueue(ws)
		if err != nil {
			t.Fatal(err)
		}
		if got := DecodeQueue(qenc); !reflect.DeepEqual(got, ws) {
			t.Fatalf("queue round trip:\n got %+v\nwant %+v", got, ws)
		}
		wenc, err := encodeWaiters(ws)
		if err != nil {
			t.Fatal(err)
		}
		compact := slices.Clone(ws)
		for i, w := range compact {
			if !w.ExpiresAt.After(w.HeartbeatAt) {
				// The compact form keeps the lease (expiry - heartbeat),
				// and only a positive one.
				compact[i].HeartbeatAt = time.Time{}
			}
		}
		if got := decodeWaiters(wenc); !reflect.DeepEqual(got, compact) {
			t.Fatalf("compact queue round trip:\n got %+v\nwant %+v", got, compact)
		}

		// Judged as the Lease store writes it, and from its spec alone.
		if !rec.ReleasedAt.IsZero() {
			return
		}
		var l coordinationv1.Lease
		if err := setHolder(&l, &rec); err != nil {
			t.Fatal(err)
		}
		for _, spec := range []coordinationv1.LeaseSpec{l.Spec, SpecOf(enc)} {
			// Live up to LOCKED TILL + margin; Expired within a second
			// after it (the spec rounds the lease up to whole seconds).
			for _, d := range []time.Duration{-time.Hour, 0, TakeoverMargin, TakeoverMargin + time.Nanosecond, TakeoverMargin + time.Second, time.Hour} {
				now := servertime.Bounds{Earliest: rec.LockedTill.Add(d), Latest: rec.LockedTill.Add(d + time.Second)}
				for _, r := range []*Record{back, nil} {
					got := Judge(r, &spec, now, TakeoverMargin)
					switch {
					case d <= TakeoverMargin && got != Live:
						t.Fatalf("Judge(record %v, spec %+v) at LOCKED TILL + %s = %s: taken before the holder's LOCKED TILL", r != nil, spec, d, got)
					case d >= TakeoverMargin+time.Second && got != Expired:
						t.Fatalf("Judge(record %v, spec %+v) at LOCKED TILL + %s = %s, want expired", r != nil, spec, d, got)
					}
				}
			}
		}
	})
}

// FuzzBeatAnnotations: the beat object's annotations (its heartbeat and
// the compact queue) and the Lease's queue either read as nothing or as
// values that encode again to a fixpoint; a beat that reads names a
// session and the release it was read for.
func FuzzBeatAnnotations(f *testing.F) {
	rec := Record{Session: "B", Operation: OpUpgrade, Who: "bob@ci", Revision: 4, LeaseDuration: metav1.Duration{Duration: 15 * time.Second}, AcquiredAt: fzAt(0), RenewedAt: fzAt(2000), LockedTill: fzAt(17000)}
	beat, _ := encodeBeat(rec)
	rec.ReleasedAt, rec.ReleasedBy = fzAt(3000), "ops"
	released, _ := encodeBeat(rec)
	ws := []Waiter{{Session: "a", Who: "x@y", Operation: OpInstall, EnqueuedAt: fzAt(1), HeartbeatAt: fzAt(2), ExpiresAt: fzAt(15002)}, {Session: "b", EnqueuedAt: fzAt(3), ExpiresAt: fzAt(4)}}
	compact, _ := encodeWaiters(ws)
	queue, _ := EncodeQueue(ws)
	f.Add(beat, compact, queue)
	f.Add(released, "[]", `{"schema":1,"waiters":null}`)
	f.Add(`{"s":""}`, "null", "")
	f.Add(`{"s":"x","d":9223372036854775807,"a":-62135596800000,"x":-1,"rel":1}`, `[{"s":"a","e":1e3,"x":"no"}]`, `{"waiters":[{"session":"a","expiresAt":"2026-01-01T00:00:00+05:30"}]}`)
	f.Fuzz(func(t *testing.T, beatAnn, waitersAnn, queueAnn string) {
		if b := decodeBeat(beatAnn, "web", "shop"); b != nil {
			if b.Session == "" || b.Schema != SchemaVersion || b.Release != "web" || b.Namespace != "shop" {
				t.Fatalf("decodeBeat(%q) = %+v: a beat names a session, the current schema and the release read", beatAnn, b)
			}
			e1, err := encodeBeat(*b)
			if err != nil {
				t.Fatal(err)
			}
			b2 := decodeBeat(e1, "web", "shop")
			if b2 == nil {
				t.Fatalf("a decoded beat encodes to %q, which does not decode", e1)
			}
			// One pass normalises (a lease in milliseconds that overflows
			// a Duration wraps once); from then on it is a fixpoint.
			e2, _ := encodeBeat(*b2)
			if b3 := decodeBeat(e2, "web", "shop"); !reflect.DeepEqual(b3, b2) {
				t.Fatalf("beat not a fixpoint:\n %+v\n %+v", b2, b3)
			}
		}

		compact := decodeWaiters(waitersAnn)
		e1, err := encodeWaiters(compact)
		if err != nil {
			t.Fatal(err)
		}
		if again := decodeWaiters(e1); len(compact) > 0 && !reflect.DeepEqual(again, compact) {
			t.Fatalf("compact queue not a fixpoint:\n %+v\n %+v", compact, again)
		}

		q := DecodeQueue(queueAnn)
		qe, err := EncodeQueue(q)
		if err != nil {
			t.Fatalf("a decoded queue does not encode again: %v", err)
		}
		q2 := DecodeQueue(qe)
		if len(q2) != len(q) {
			t.Fatalf("queue of %d waiters reads back as %d", len(q), len(q2))
		}
		if qe2, _ := EncodeQueue(q2); qe2 != qe {
			t.Fatalf("queue not a fixpoint:\n %s\n %s", qe, qe2)
		}
	})
}

// FuzzJudge: a lock is Free exactly when nobody holds it; Expired only when
// the earliest possible server time is past LOCKED TILL plus the margin
// (the latest bound never counts); once Expired it stays so as time passes;
// a record never shortens a lock, and one of another session is ignored;
// a later renewal or a larger margin never turns Live into Expired. The
// queue drops only waiters certainly past their expiry, and a waiter whose
// entry is live never moves back.
func FuzzJudge(f *testing.F) {
	f.Add(byte(2), byte(1), int32(0), true, int32(-1000), true, int32(10), true, int32(10000), false, int32(11001), uint16(1000), uint16(1000), int32(5000), []byte{0, 1, 2, 3})
	f.Add(byte(2), byte(2), int32(0), true, int32(0), false, int32(10), true, int32(3600000), false, int32(12000), uint16(0), uint16(250), int32(1), []byte{})
	f.Add(byte(1), byte(0), int32(-3600000), true, int32(0), false, int32(10), true, int32(0), true, int32(0), uint16(0), uint16(0), int32(0), []byte{9, 9})
	f.Add(byte(2), byte(0), int32(0), false, int32(0), false, int32(0), false, int32(0), true, int32(3600000), uint16(5), uint16(250), int32(100), []byte{0xff})
	f.Fuzz(func(t *testing.T, holderSel, recSel byte, renewMs int32, hasRenew bool, acquireMs int32, hasAcquire bool, durSecs int32, hasDur bool,
		recTillMs int32, recTillZero bool, nowMs int32, widthMs, marginMs uint16, laterMs int32, queue []byte,
	) {
		var spec *coordinationv1.LeaseSpec
		if holderSel%3 != 0 {
			spec = &coordinationv1.LeaseSpec{}
			if holderSel%3 == 2 {
				spec.HolderIdentity = ptr("a")
			} else {
				spec.HolderIdentity = ptr("")
			}
			if hasRenew {
				spec.RenewTime = &metav1.MicroTime{Time: fzAt(int64(renewMs))}
			}
			if hasAcquire {
				spec.AcquireTime = &metav1.MicroTime{Time: fzAt(int64(acquireMs))}
			}
			if hasDur {
				spec.LeaseDurationSeconds = ptr(durSecs)
			}
		}
		var rec *Record
		if recSel%3 != 0 {
			rec = &Record{Schema: SchemaVersion, Session: "a"}
			if recSel%3 == 2 {
				rec.Session = "old"
			}
			if !recTillZero {
				rec.LockedTill = fzAt(int64(recTillMs))
			}
		}
		margin := time.Duration(marginMs) * time.Millisecond
		now := fzBounds(int64(nowMs), widthMs)
		later := int64(max(laterMs, 0))

		st := Judge(rec, spec, now, margin)
		if free := spec == nil || HolderOf(spec) == ""; (st == Free) != free {
			t.Fatalf("Judge = %s, but the lock is held: %v", st, !free)
		}
		till, ok := LockedTill(rec, spec)
		if st == Expired && (!ok || !now.Earliest.After(till.Add(margin))) {
			t.Fatalf("Expired at %s, LOCKED TILL %s (known %v) + margin %s", now.Earliest, till, ok, margin)
		}
		if st == Live && ok && now.Earliest.After(till.Add(margin)) {
			t.Fatalf("Live at %s past LOCKED TILL %s + margin %s", now.Earliest, till, margin)
		}
		if got := Judge(rec, spec, servertime.Bounds{Earliest: now.Earliest, Latest: now.Earliest.Add(time.Hour)}, margin); got != st {
			t.Fatalf("the latest bound changed the judgement: %s, then %s", st, got)
		}
		if Judge(rec, spec, servertime.Bounds{}, margin) == Expired {
			t.Fatal("Expired with no server time")
		}
		if st == Expired {
			if got := Judge(rec, spec, fzBounds(int64(nowMs)+later, widthMs), margin); got != Expired {
				t.Fatalf("Expired at %s, %s %s later", st, got, time.Duration(later)*time.Millisecond)
			}
			if got := Judge(rec, spec, now, margin/2); got != Expired {
				t.Fatalf("Expired with margin %s, %s with a smaller one", margin, got)
			}
		}
		if st == Live && spec != nil && spec.RenewTime != nil {
			renewed := *spec
			renewed.RenewTime = &metav1.MicroTime{Time: spec.RenewTime.Add(time.Duration(later) * time.Millisecond)}
			if got := Judge(rec, &renewed, now, margin); got != Live {
				t.Fatalf("a later renewal turned Live into %s", got)
			}
		}
		if bare, bareOK := LockedTill(nil, spec); bareOK {
			if !ok || till.Before(bare) {
				t.Fatalf("the record shortened the lock: %s (known %v), spec alone %s", till, ok, bare)
			}
			if rec != nil && rec.Session != HolderOf(spec) && !till.Equal(bare) {
				t.Fatalf("a record of session %q changed the lock of %q: %s, spec alone %s", rec.Session, HolderOf(spec), till, bare)
			}
		}

		// The queue, from two bytes per waiter: its expiry and its session.
		var ws []Waiter
		for i := 0; i+1 < len(queue) && len(ws) < 16; i += 2 {
			ws = append(ws, Waiter{Session: "w" + strconv.Itoa(int(queue[i+1]%8)), ExpiresAt: fzAt(int64(nowMs) + int64(int8(queue[i]))*100)})
		}
		live := liveWaiters(ws, now, margin)
		j := 0
		for _, w := range ws {
			gone := now.Earliest.After(w.ExpiresAt.Add(margin))
			if !gone {
				if j >= len(live) || live[j] != w {
					t.Fatalf("liveWaiters(%+v) = %+v: a live waiter is missing or out of order", ws, live)
				}
				j++
			}
		}
		if j != len(live) {
			t.Fatalf("liveWaiters(%+v) = %+v: kept a waiter past its expiry", ws, live)
		}
		laterNow := fzBounds(int64(nowMs)+later, widthMs)
		liveLater := liveWaiters(ws, laterNow, margin)
		for _, s := range []string{"w0", "w3", "nobody"} {
			ahead := waitersAhead(live, s)
			if ahead > len(live) || (ahead < len(live) && live[ahead].Session != s) {
				t.Fatalf("waitersAhead(%s) = %d in %+v", s, ahead, live)
			}
			if i := slices.IndexFunc(ws, func(w Waiter) bool { return w.Session == s }); i >= 0 && !laterNow.Earliest.After(ws[i].ExpiresAt.Add(margin)) {
				if a := waitersAhead(liveLater, s); a > ahead {
					t.Fatalf("waiter %s, still live, moved back from %d to %d as time passed", s, ahead, a)
				}
			}
		}
	})
}

// FuzzGateAnnotations: the references the release store writes into
// annotations parse back to what was written: claimed-on (NAME@RV@SESSION,
// cut at the last @) and gate-at (NAME@RV, cut at the first @). A claim counts
// against the gate it names, at the version it names, and against no other
// version. The revision a take names (nextRevision) is one past a settled
// newest record's, or unknown.
func FuzzGateAnnotations(f *testing.F) {
	f.Add("sh.helm.release.v1.web.v3", "5", "5d1f2b7c-8a3e-4f0a-9c1d-2e3f4a5b6c7d", "6", "3", "deployed", byte(1))
	f.Add("sh.helm.release.v1.a.b.v12", "184467", "A", "184468", "12", "pending-upgrade", byte(0))
	f.Add("sh.helm.release.v1.web.v1", "", "", "1", "-1", "failed", byte(2))
	f.Add("x@y", "1@2", "s@t", "1/2", "0x10", "superseded", byte(3))
	f.Add("sh.helm.release.v1.web.v9223372036854775807", "7", "s", "8", "9223372036854775807", "deployed", byte(1))
	f.Fuzz(func(t *testing.T, name, rv, session, otherRV, anchorRev, anchorStatus string, op byte) {
		session = strings.ToValidUTF8(session, "\uFFFD") // as the claim's JSON carries it
		on := ClaimedOn(session, name, rv)
		at, who, found := cutLast(on, "@")
		if !found || (!strings.Contains(session, "@") && (at != RecordAt(name, rv) || who != session)) {
			t.Fatalf("ClaimedOn(%q, %q, %q) = %q reads back as %q, %q", session, name, rv, on, at, who)
		}
		if !strings.Contains(name, "@") { // an object name never holds one
			if n, r, ok := strings.Cut(RecordAt(name, rv), "@"); !ok || n != name || r != rv {
				t.Fatalf("RecordAt(%q, %q) reads back as %q, %q", name, rv, n, r)
			}
		}

		// A claim by session against record name at rv, read with the
		// gate at rv and at otherRV.
		if session != "" && !strings.Contains(session, "@") {
			claim := &Record{Schema: SchemaVersion, Session: session}
			lease := func(gateRV string) *Snapshot {
				return &Snapshot{
					Newest: &Newest{Name: name, ResourceVersion: gateRV},
					Claim:  &Claim{Record: claim, On: on},
				}
			}
			if !claimAgainstGate(lease(rv)) {
				t.Fatalf("a claim %q does not count against the gate it names (%s at %q)", on, name, rv)
			}
			if otherRV != rv && claimAgainstGate(lease(otherRV)) {
				t.Fatalf("a claim %q counts against %s at another version %q", on, name, otherRV)
			}
			other := lease(otherRV)
			other.Claim.On = ClaimedOn(session+"x", name, rv)
			if !claimAgainstGate(other) {
				t.Fatal("a claimed-on written for another session (an earlier version's claim over it) must not void the claim")
			}
		}

		req := &Request{Operation: fzOp(op)}
		n, err := strconv.Atoi(anchorRev)
		newest := &Newest{Status: anchorStatus, Revision: n}
		if err != nil {
			newest.Revision = 0 // an unreadable revision label (records.Record.Revision)
		}
		next := nextRevision(req, newest)
		switch {
		case next == 0:
		case req.Operation != OpInstall && req.Operation != OpUpgrade && req.Operation != OpRollback:
			t.Fatalf("nextRevision for %s = %d: an operation that writes no revision names none", req.Operation, next)
		case !SettledStatus(anchorStatus):
			t.Fatalf("nextRevision = %d past a %q newest record, which may be recovered first", next, anchorStatus)
		case n == math.MaxInt:
			t.Fatalf("nextRevision after the largest revision = %d: there is none to name", next)
		case err != nil || n <= 0 || next != n+1 || next <= 0:
			t.Fatalf("nextRevision(anchor revision %q) = %d", anchorRev, next)
		}
		if err == nil && n > 0 && n < math.MaxInt && SettledStatus(anchorStatus) && (req.Operation == OpInstall || req.Operation == OpUpgrade || req.Operation == OpRollback) && next != n+1 {
			t.Fatalf("nextRevision after settled revision %d = %d, want %d", n, next, n+1)
		}
	})
}

// FuzzGateAndBeat: the release store's lock read from a gate a holder
// wrote (gateForm) and any beat (docs/protocol.md, "The lock on the release
// record: gate and beat", rules 4 and 5):
//
//   - the gate's holder is never judged expired before its own renewedAt +
//     leaseDuration plus the margin, whatever the beat says;
//   - a beat that says nothing of the holder (missing, unreadable, a claim
//     from a stale view, or the holder's own marked released by a person
//     before its gate) leaves the gate judged by the bound it was written
//     with;
//   - the holder's own beat extends the lock to the later LOCKED TILL;
//   - a fresh claim against the gate as it stands is Live for everybody but
//     its claimant, until its own LOCKED TILL plus the margin.
func FuzzGateAndBeat(f *testing.F) {
	f.Add("A", int32(0), uint32(15000), uint32(3600000), false, byte(2), "", int32(10000), int32(25000), false, "Z", byte(0), "", int32(20000), uint16(100), "C")
	f.Add("A", int32(0), uint32(15000), uint32(0), false, byte(3), "", int32(16000), int32(31000), false, "A", byte(1), "", int32(20000), uint16(100), "C")
	f.Add("A", int32(0), uint32(15000), uint32(3600000), false, byte(3), "", int32(0), int32(15000), false, "X", byte(0), "", int32(3700000), uint16(0), "C")
	f.Add("A", int32(0), uint32(15000), uint32(3600000), false, byte(2), "", int32(1000), int32(16000), true, "", byte(0), "", int32(3616000), uint16(0), "C")
	f.Add("A", int32(0), uint32(15000), uint32(0), true, byte(3), "", int32(3000), int32(18000), false, "A", byte(2), "", int32(5000), uint16(0), "B")
	f.Add("A", int32(0), uint32(6000), uint32(0), false, byte(1), "{", int32(0), int32(0), false, "", byte(4), "sh.helm.release.v1.web.v3@5@B", int32(90000000), uint16(5), "")
	f.Fuzz(func(t *testing.T, holder string, renewMs int32, leaseMs, maxHoldMs uint32, gateReleased bool,
		beatMode byte, beatRaw string, beatRenewMs, beatTillMs int32, beatReleased bool, from string,
		onMode byte, onRaw string, nowMs int32, widthMs uint16, self string,
	) {
		holder = fzText(holder, "A")
		lease := fzLease(leaseMs)
		take := fzBounds(int64(renewMs), 0)
		g := newRecord(&Request{Session: holder, Operation: OpUpgrade, Release: "web", Namespace: "shop", LeaseDuration: lease, MaxHold: time.Duration(maxHoldMs) * time.Millisecond}, take)
		if gateReleased {
			g.ReleasedAt = g.RenewedAt.Add(time.Second)
		}
		gate := gateForm(g)
		gateEnc, err := gate.Encode()
		if err != nil {
			t.Fatal(err)
		}

		const recordName, gateRV = "sh.helm.release.v1.web.v3", "5"
		var beatAnn map[string]string
		var claimant string
		switch beatMode % 4 {
		case 1:
			beatAnn = map[string]string{Stores.AnnotationBeat: beatRaw}
		case 2, 3:
			claimant = holder
			if beatMode%4 == 3 {
				claimant = fzText(self, "B") + "-claim"
			}
			b := Record{Session: claimant, Operation: OpUpgrade, LeaseDuration: metav1.Duration{Duration: lease}, AcquiredAt: fzAt(int64(beatRenewMs)), RenewedAt: fzAt(int64(beatRenewMs)), LockedTill: fzAt(int64(beatTillMs))}
			if beatReleased {
				b.ReleasedAt = fzAt(int64(beatRenewMs))
			}
			enc, err := encodeBeat(b)
			if err != nil {
				t.Fatal(err)
			}
			beatAnn = map[string]string{Stores.AnnotationBeat: enc}
		}
		if beatAnn != nil {
			beatAnn[Stores.AnnotationClaimedFrom] = from
			switch onMode % 5 {
			case 1:
				beatAnn[Stores.AnnotationClaimedOn] = ClaimedOn(claimant, recordName, gateRV)
			case 2:
				beatAnn[Stores.AnnotationClaimedOn] = ClaimedOn(claimant, recordName, gateRV+"0")
			case 3:
				beatAnn[Stores.AnnotationClaimedOn] = ClaimedOn(claimant+"-other", recordName, gateRV)
			case 4:
				beatAnn[Stores.AnnotationClaimedOn] = onRaw
			}
		}
		r := records.Record{Kind: records.KindSecret, Meta: metav1.ObjectMeta{
			Name: recordName, Namespace: "shop", ResourceVersion: gateRV,
			Labels:      map[string]string{"owner": "helm", "name": "web", "version": "3", "status": "pending-upgrade"},
			Annotations: map[string]string{AnnotationRecord: gateEnc},
		}}
		var beat *metav1.ObjectMeta
		if beatAnn != nil {
			beat = &metav1.ObjectMeta{Name: LeaseName("web"), Namespace: "shop", ResourceVersion: "7", Labels: LockLabels("web"), Annotations: beatAnn}
		}
		l := Stores.ReleaseSnapshot("shop", "web", r, beat, "9")
		now := fzBounds(int64(nowMs), widthMs)
		v := (&Backend{Margin: TakeoverMargin}).decode(l, now, self)

		bt := decodeBeat(beatAnn[Stores.AnnotationBeat], "web", "shop")
		expiredBy := func(till time.Time) bool { return now.Earliest.After(till.Add(TakeoverMargin)) }

		if gateReleased {
			if HolderOf(&l.Spec) != "" {
				t.Fatalf("a released gate is held by %q", HolderOf(&l.Spec))
			}
		} else {
			if got := HolderOf(&l.Spec); got != holder {
				t.Fatalf("the gate's holder %q reads as %q", holder, got)
			}
			if v.state == Free {
				t.Fatal("the gate's holder's lock is judged free")
			}
			if v.state == Expired && !expiredBy(g.LockedTill) {
				t.Fatalf("Expired at %s, before the holder's own LOCKED TILL %s + margin", now.Earliest, g.LockedTill)
			}
			own := bt != nil && bt.Session == holder
			saysNothing := bt == nil || (own && !bt.ReleasedAt.IsZero()) || (!own && from != holder)
			if v.state == Expired && saysNothing && !expiredBy(gate.LockedTill) {
				t.Fatalf("Expired at %s with a beat that says nothing of the holder (%+v, claimed from %q), before the gate's bound %s", now.Earliest, bt, from, gate.LockedTill)
			}
			if v.state == Expired && own && bt.ReleasedAt.IsZero() && !expiredBy(later(g.LockedTill, bt.LockedTill)) {
				t.Fatalf("Expired at %s before the holder's beat's LOCKED TILL %s", now.Earliest, bt.LockedTill)
			}
		}

		if v.claim != nil && v.claim.Session == self {
			t.Fatalf("%q's own claim blocks it", self)
		}
		// A fresh claim against the gate as it stands.
		_, encodes := bt.Encode() // a claim whose times JSON cannot carry is not shown
		fresh := bt != nil && encodes == nil && bt.ReleasedAt.IsZero() && bt.Session != holder && bt.Session != self && !expiredBy(bt.LockedTill)
		againstGate := beatAnn[Stores.AnnotationClaimedOn] == "" || onMode%5 == 1 || onMode%5 == 3
		if fresh && from == holder && onMode%5 != 4 && againstGate && v.state != Live {
			t.Fatalf("a fresh claim by %q from the gate's holder (claimed-on %q) is judged %s by %q", bt.Session, beatAnn[Stores.AnnotationClaimedOn], v.state, self)
		}
	})
}
