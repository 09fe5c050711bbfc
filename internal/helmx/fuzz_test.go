package helmx

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/release/common"
	rspb "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/lock/releasestore"
	"github.com/helm-autorecover/helm-autorecover/internal/records"
)

// Fuzz targets for helm's release records as this program reads and edits
// them (issue 14). Helm's own storage driver is the oracle: what it writes
// we read alike, what we write it reads, and recovery's edit changes
// nothing but info.status and info.description. `make fuzz` runs each for
// $(FUZZ_TIME); the seeds run as plain unit tests.

// helmStore is helm's Secret driver over an in-memory namespace: helm's
// own encoder and decoder, without a cluster (a fake clientset spends tens
// of milliseconds a write on managed fields).
type helmStore struct {
	secrets *memSecrets
	driver  *driver.Secrets
}

const fuzzNS = "shop"

// memSecrets is the part of a Secrets client helm's driver calls.
type memSecrets struct {
	typedcorev1.SecretInterface // the rest: never called
	m                           map[string]*corev1.Secret
}

func (s *memSecrets) Create(_ context.Context, sec *corev1.Secret, _ metav1.CreateOptions) (*corev1.Secret, error) {
	if _, ok := s.m[sec.Name]; ok {
		return nil, apierrors.NewAlreadyExists(corev1.Resource("secrets"), sec.Name)
	}
	sec = sec.DeepCopy()
	sec.Namespace = fuzzNS
	s.m[sec.Name] = sec
	return sec.DeepCopy(), nil
}

func (s *memSecrets) Get(_ context.Context, name string, _ metav1.GetOptions) (*corev1.Secret, error) {
	sec, ok := s.m[name]
	if !ok {
		return nil, apierrors.NewNotFound(corev1.Resource("secrets"), name)
	}
	return sec.DeepCopy(), nil
}

func newHelmStore() helmStore {
	m := &memSecrets{m: map[string]*corev1.Secret{}}
	return helmStore{secrets: m, driver: driver.NewSecrets(m)}
}

// write stores rel through helm's driver and returns the Secret helm wrote.
func (h helmStore) write(tb testing.TB, rel *rspb.Release) *corev1.Secret {
	tb.Helper()
	key := ReleaseSecretName(rel.Name, rel.Version)
	delete(h.secrets.m, key)
	if err := h.driver.Create(key, rel); err != nil {
		tb.Fatalf("helm's driver cannot store the release: %v", err)
	}
	return h.secrets.m[key].DeepCopy()
}

// read has helm's driver read s, as stock helm reads a record we wrote.
func (h helmStore) read(s *corev1.Secret) (*rspb.Release, error) {
	s = s.DeepCopy()
	s.Namespace = fuzzNS
	h.secrets.m[s.Name] = s
	defer delete(h.secrets.m, s.Name)
	rel, err := h.driver.Get(s.Name)
	if err != nil {
		return nil, err
	}
	return rel.(*rspb.Release), nil
}

// fuzzReleases are real-looking releases, in the statuses recovery meets.
func fuzzReleases() []*rspb.Release {
	pending := sampleRelease()
	deployed := sampleRelease()
	deployed.Version, deployed.Info.Status, deployed.Info.Description = 3, common.StatusDeployed, "Upgrade complete"
	deployed.Info.Notes = "Visit http://web.shop.svc <here> & there"
	deployed.Hooks = []*rspb.Hook{{Name: "web-migrate", Kind: "Job", Path: "web/templates/migrate.yaml", Manifest: "kind: Job\n", Events: []rspb.HookEvent{rspb.HookPreUpgrade}, Weight: -5}}
	deployed.Labels = map[string]string{"team": "payments"}
	uninstalling := sampleRelease()
	uninstalling.Name, uninstalling.Version, uninstalling.Info.Status, uninstalling.Info.Description = "my.release-1", 12, common.StatusUninstalling, "Deletion in progress (or silently failed)"
	install := sampleRelease()
	install.Version, install.Info.Status = 1, common.StatusPendingInstall
	install.Info.FirstDeployed, install.Info.LastDeployed = time.Time{}, time.Time{}
	install.Chart.Metadata.Version = "0.1.0-rc.1+build.5"
	return []*rspb.Release{pending, deployed, uninstalling, install}
}

// FuzzDecodeReleasePayload: DecodeReleaseJSON either fails or returns a
// JSON object that EncodeReleaseJSON writes back and DecodeReleaseJSON
// reads back byte for byte. It agrees with helm's own decoder: a payload
// helm reads as a release we read too (helm also takes a bare JSON null,
// which names no release), as the same document, and Summarize reports
// the name, namespace, revision, status, description and chart helm read.
func FuzzDecodeReleasePayload(f *testing.F) {
	h := newHelmStore()
	for _, rel := range fuzzReleases() {
		f.Add(h.write(f, rel).Data[ReleaseDataKey])
	}
	b64 := func(s string) []byte { return []byte(base64.StdEncoding.EncodeToString([]byte(s))) }
	f.Add(b64(`{"name":"web","version":1,"info":{"status":"deployed","first_deployed":"","last_deployed":""}}`))
	f.Add(b64(`null`))
	// Keys equal but for case: helm reads info in sorted key order, not in
	// document order (issue 31).
	f.Add(b64(`{"name":"web","version":1,"info":{"status":"deployed","STATUS":"pending-upgrade"}}`))
	f.Add(b64(`{"name":"web","version":1,"info":{"ſtatus":"deployed","status":"pending-upgrade","Description":"b","description":"a"}}`))
	f.Add(b64("\x1f\x8b\x08"))
	f.Add([]byte("%%%"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, data []byte) {
		doc, err := DecodeReleaseJSON(data)
		if err == nil {
			if checkObject(doc) != nil {
				t.Fatalf("DecodeReleaseJSON returned %q, which is not a JSON object", doc)
			}
			enc, err := EncodeReleaseJSON(doc)
			if err != nil {
				t.Fatalf("EncodeReleaseJSON refuses what DecodeReleaseJSON returned: %v", err)
			}
			back, err := DecodeReleaseJSON(enc)
			if err != nil || !bytes.Equal(back, doc) {
				t.Fatalf("payload round trip: %v\n got %q\nwant %q", err, back, doc)
			}
		}

		sec := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "sh.helm.release.v1.web.v1", Namespace: fuzzNS, Labels: map[string]string{LabelName: "web", LabelOwner: OwnerHelm, LabelVersion: "1"}},
			Type:       ReleaseSecretType,
			Data:       map[string][]byte{ReleaseDataKey: data},
		}
		helmRel, helmErr := h.read(sec)
		if helmErr != nil {
			return
		}
		if err != nil {
			if plain, _ := base64.StdEncoding.DecodeString(string(data)); bytes.Equal(bytes.TrimSpace(plain), []byte("null")) {
				return
			}
			t.Fatalf("helm reads the payload as release %q v%d, DecodeReleaseJSON fails: %v", helmRel.Name, helmRel.Version, err)
		}
		var ours rspb.Release
		if err := json.Unmarshal(doc, &ours); err != nil {
			t.Fatalf("helm reads the payload, not the document DecodeReleaseJSON returned: %v", err)
		}
		ours.Labels = helmRel.Labels
		if !reflect.DeepEqual(&ours, helmRel) {
			t.Fatalf("DecodeReleaseJSON and helm read different releases:\n ours %+v\n helm %+v", ours, helmRel)
		}
		sum, err := Summarize(sec)
		if err != nil {
			t.Fatalf("helm reads the release, Summarize fails: %v", err)
		}
		checkSummary(t, sum, helmRel, sec)
	})
}

// checkSummary compares a Summary with the release helm read from s.
func checkSummary(t *testing.T, sum Summary, rel *rspb.Release, s *corev1.Secret) {
	t.Helper()
	wantName, wantNS, wantRev := rel.Name, rel.Namespace, rel.Version
	if wantName == "" {
		wantName = s.Labels[LabelName]
	}
	if wantNS == "" {
		wantNS = s.Namespace
	}
	if wantRev == 0 {
		wantRev = records.RevisionOf(s.Labels)
	}
	var status common.Status
	var desc string
	if rel.Info != nil {
		status, desc = rel.Info.Status, rel.Info.Description
	}
	var chartName, chartVersion string
	if rel.Chart != nil && rel.Chart.Metadata != nil {
		chartName, chartVersion = rel.Chart.Metadata.Name, rel.Chart.Metadata.Version
	}
	if sum.Name != wantName || sum.Namespace != wantNS || sum.Revision != wantRev || sum.Status != status || sum.Description != desc ||
		sum.ChartName != chartName || sum.ChartVersion != chartVersion {
		t.Fatalf("Summarize disagrees with helm:\n summary %s/%s v%d %q %q chart %q %q\n helm    %s/%s v%d %q %q chart %q %q",
			sum.Namespace, sum.Name, sum.Revision, sum.Status, sum.Description, sum.ChartName, sum.ChartVersion,
			wantNS, wantName, wantRev, status, desc, chartName, chartVersion)
	}
	if rel.Info != nil && (!sum.FirstDeployed.Equal(rel.Info.FirstDeployed) || !sum.LastDeployed.Equal(rel.Info.LastDeployed)) {
		t.Fatalf("Summarize times %s %s, helm %s %s", sum.FirstDeployed, sum.LastDeployed, rel.Info.FirstDeployed, rel.Info.LastDeployed)
	}
}

var fuzzStatuses = []common.Status{
	common.StatusUnknown, common.StatusDeployed, common.StatusUninstalled, common.StatusSuperseded, common.StatusFailed,
	common.StatusUninstalling, common.StatusPendingInstall, common.StatusPendingUpgrade, common.StatusPendingRollback,
}

// FuzzMarkFailedReadByHelm: a release helm stored is read by Summarize as
// helm reads it; recovery's edit (info.status failed and a description,
// as recovery.apply writes it) is read by stock helm as the same release
// with only those two fields changed, by Summarize likewise, and changes
// the content hash, which the lock's annotations never do (S6, S7).
func FuzzMarkFailedReadByHelm(f *testing.F) {
	f.Add("web", 4, byte(7), "Preparing upgrade", "nginx", "1.2.3", int64(0), int64(3600000), "---\nkind: ConfigMap\n", "replicas", "3",
		"Abandoned pending-upgrade by alice@ci-7 (session 0f3c, operation upgrade); lock expired at 2026-12-02T13:09:54Z; recovered by helm-autorecover session 046b at 2026-12-02T13:09:58Z")
	f.Add("my.release-1", 1, byte(6), "", "", "", int64(-1), int64(0), "", "", "", "recovered <by> test & co\u2028")
	f.Add(strings.Repeat("a", 53), 2147483647, byte(5), "Deletion in progress (or silently failed)", "chart-with-a-long-name", "0.1.0-rc.1+build.5", int64(86400000), int64(86400001), "a: b\n", "x.y", "\"quoted\"", "")
	h := newHelmStore()
	f.Fuzz(func(t *testing.T, name string, version int, status byte, description, chartName, chartVersion string, firstMs, lastMs int64, manifest, configKey, configValue, recoveryNote string) {
		if lock.ValidateReleaseName(name) != nil {
			name = "web"
		}
		at := func(ms int64) time.Time {
			if ms < 0 {
				return time.Time{}
			}
			return time.Date(2026, 1, 2, 3, 4, 5, 600000000, time.UTC).Add(time.Duration(ms%(1<<40)) * time.Millisecond)
		}
		rel := &rspb.Release{
			Name: name, Namespace: fuzzNS, Version: version,
			Info: &rspb.Info{
				FirstDeployed: at(firstMs), LastDeployed: at(lastMs), Status: fuzzStatuses[int(status)%len(fuzzStatuses)], Description: description,
			},
			Chart:    &chart.Chart{Metadata: &chart.Metadata{APIVersion: "v2", Name: chartName, Version: chartVersion}},
			Config:   map[string]any{configKey: configValue},
			Manifest: manifest,
		}
		sec := h.write(t, rel)
		asStored, err := h.read(sec)
		if err != nil {
			t.Fatalf("helm cannot read what it wrote: %v", err)
		}

		// Summarize reads what helm wrote as helm reads it; so do the labels.
		sum, err := Summarize(sec)
		if err != nil {
			t.Fatalf("Summarize cannot read what helm wrote: %v", err)
		}
		checkSummary(t, sum, asStored, sec)
		if got := records.RevisionOf(sec.Labels); got != version {
			t.Fatalf("the version label %q reads as revision %d, want %d", sec.Labels[LabelVersion], got, version)
		}
		meta, ok := SummarizeMeta(SecretRecord(sec))
		wantOK := version > 0 && rel.Info.Status != common.StatusUnknown
		if ok != wantOK || (ok && (meta.Revision != version || meta.Status != rel.Info.Status || meta.Name != name)) {
			t.Fatalf("SummarizeMeta(labels %v) = v%d %q %q, %v; want v%d %q, %v", sec.Labels, meta.Revision, meta.Status, meta.Name, ok, version, rel.Info.Status, wantOK)
		}

		// Recovery's edit, read by stock helm.
		doc, err := DecodeReleaseJSON(sec.Data[ReleaseDataKey])
		if err != nil {
			t.Fatal(err)
		}
		note := strings.ToValidUTF8(recoveryNote, "\uFFFD")
		edited, err := SetInfoFields(doc, map[string]any{"status": common.StatusFailed, "description": note})
		if err != nil {
			t.Fatal(err)
		}
		payload, err := EncodeReleaseJSON(edited)
		if err != nil {
			t.Fatal(err)
		}
		marked := sec.DeepCopy()
		marked.Data[ReleaseDataKey] = payload
		marked.Labels[LabelStatus] = string(common.StatusFailed)
		got, err := h.read(marked)
		if err != nil {
			t.Fatalf("stock helm cannot read the release recovery marked failed: %v", err)
		}
		want := *asStored
		info := *asStored.Info
		info.Status, info.Description = common.StatusFailed, note
		want.Info = &info
		if !reflect.DeepEqual(got, &want) {
			t.Fatalf("marking failed changed more than status and description:\n got %+v %+v\nwant %+v %+v", got, got.Info, want, want.Info)
		}
		msum, err := Summarize(marked)
		if err != nil {
			t.Fatal(err)
		}
		checkSummary(t, msum, got, marked)
		if msum.ContentHash == sum.ContentHash {
			t.Fatal("marking failed kept the content hash")
		}
		annotated := marked.DeepCopy()
		annotated.Annotations = map[string]string{lock.AnnotationRecord: `{"schema":1,"session":"s"}`}
		annotated.ResourceVersion = "99"
		if asum, _ := Summarize(annotated); asum.ContentHash != msum.ContentHash {
			t.Fatal("a lock annotation changed the content hash")
		}
	})
}

// FuzzSetInfoFields: SetInfoFields fails exactly when the document is not
// a JSON object or its info is neither an object nor null; otherwise it
// returns a JSON object in which the given info keys hold the given values
// and every other value, at any depth and of any name (fields helm does
// not know included), is what it was; the edit is idempotent and the
// payload codec carries it unchanged.
func FuzzSetInfoFields(f *testing.F) {
	for _, rel := range fuzzReleases() {
		b, err := json.Marshal(rel)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b), "status", "failed")
	}
	f.Add(`{"name":"web","x_lock":{"session":"abc"},"config":{"big":12345678901234567890},"info":{"x_note":"kept","status":"pending-upgrade"}}`, "description", "recovered <by> test & co")
	f.Add(`{"info":null}`, "status", "")
	f.Add(`{"info":"deployed"}`, "status", "failed")
	f.Add(`{"info":{"Status":"deployed"},"info":{"status":"pending-install"}}`, "Status", "x")
	f.Add(`{"info":{"STATUS":"pending-upgrade","status":"pending-upgrade","ſtatus":"pending-upgrade","Description":"d"}}`, "description", "recovered")
	f.Add(`null`, "status", "failed")
	f.Add(`[{"info":{}}]`, "status", "failed")
	f.Fuzz(func(t *testing.T, doc, key, value string) {
		key = strings.ToValidUTF8(key, "\uFFFD") // the keys recovery sets are constants
		set := map[string]any{key: value, "status": common.StatusFailed}
		out, err := SetInfoFields(json.RawMessage(doc), set)

		var before map[string]any
		wantErr := decodeNumbers([]byte(doc), &before) != nil || before == nil ||
			(key != "status" && strings.EqualFold(key, "status")) // one field to helm
		var infoBefore map[string]any
		if !wantErr {
			switch v := before["info"].(type) {
			case nil:
			case map[string]any:
				infoBefore = v
			default:
				wantErr = true
			}
		}
		if (err != nil) != wantErr {
			t.Fatalf("SetInfoFields(%q) error %v, want an error: %v", doc, err, wantErr)
		}
		if err != nil {
			return
		}
		var after map[string]any
		if checkObject(out) != nil || decodeNumbers(out, &after) != nil {
			t.Fatalf("SetInfoFields returned %q, not a JSON object", out)
		}
		wantInfo := map[string]any{}
		for k, v := range infoBefore {
			wantInfo[k] = v
		}
		for k, v := range set {
			b, _ := json.Marshal(v)
			var dv any
			if err := decodeNumbers(b, &dv); err != nil {
				t.Fatal(err)
			}
			wantInfo[k] = dv
			// Keys equal but for case are one field to helm: set too.
			for other := range infoBefore {
				if strings.EqualFold(other, k) {
					wantInfo[other] = dv
				}
			}
		}
		before["info"] = wantInfo
		if !reflect.DeepEqual(after, before) {
			t.Fatalf("SetInfoFields(%q, %v):\n got %v\nwant %v", doc, set, after, before)
		}
		var read struct {
			Info *rspb.Info `json:"info"`
		}
		if json.Unmarshal(out, &read) == nil && read.Info != nil && read.Info.Status != common.StatusFailed {
			t.Fatalf("helm reads status %q from the edit %s", read.Info.Status, out)
		}
		again, err := SetInfoFields(out, set)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("SetInfoFields is not idempotent: %v\n %s\n %s", err, out, again)
		}
		payload, err := EncodeReleaseJSON(out)
		if err != nil {
			t.Fatal(err)
		}
		if back, err := DecodeReleaseJSON(payload); err != nil || !bytes.Equal(back, out) {
			t.Fatalf("payload round trip of the edit: %v", err)
		}
	})
}

// decodeNumbers is json.Unmarshal keeping numbers as their text.
func decodeNumbers(b []byte, v any) error {
	if !json.Valid(b) {
		return errors.New("not JSON")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	return dec.Decode(v)
}

// FuzzSummarizeMeta: a record's labels and annotations as recovery reads
// them without the payload: the revision is the version label's number (0
// when it is not one), the metadata alone suffices exactly when it names a
// revision and a status, the sessions named are those of the lock
// annotation as lock.DecodeRecord reads it (its holder and the holder it
// names abandoned; none when unreadable), the last write time is the
// newest managed-fields time of a writer other than the lock, and the
// content hash ignores annotations.
func FuzzSummarizeMeta(f *testing.F) {
	f.Add("4", "pending-upgrade", "web", `{"schema":1,"session":"s-1","abandoned":{"schema":1,"session":"s-0"}}`, int64(0), byte(1), int64(90000), byte(0), int64(-1))
	f.Add("4", "pending-rollback", "web", `{"schema":1,"session":"s-1","revision":4}`, int64(0), byte(0), int64(0), byte(0), int64(-1))
	f.Add("", "deployed", "web", "", int64(0), byte(0), int64(0), byte(1), int64(5000))
	f.Add("x", "", "", `{"schema":2,"session":"s-9"}`, int64(-1), byte(2), int64(1), byte(2), int64(2))
	f.Add("+7", "unknown", "my.release-1", "nope", int64(100), byte(0), int64(-1000), byte(0), int64(-1))
	f.Add("0012", "uninstalling", "web", `{"session":"s"}`, int64(7), byte(1), int64(7), byte(1), int64(7))
	f.Fuzz(func(t *testing.T, version, status, name, lockAnn string, createdMs int64, mgr1 byte, at1 int64, mgr2 byte, at2 int64) {
		base := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
		ts := func(ms int64) time.Time { return base.Add(time.Duration(ms%(1<<40)) * time.Millisecond) }
		managers := []string{"helm", releasestore.FieldManager, "kubectl-edit"}
		var mf []metav1.ManagedFieldsEntry
		var wantWrite time.Time
		for _, e := range []struct {
			mgr byte
			ms  int64
		}{{mgr1, at1}, {mgr2, at2}} {
			m := metav1.ManagedFieldsEntry{Manager: managers[int(e.mgr)%len(managers)]}
			if e.ms >= 0 {
				m.Time = &metav1.Time{Time: ts(e.ms)}
				if m.Manager != releasestore.FieldManager && m.Time.After(wantWrite) {
					wantWrite = m.Time.Time
				}
			}
			mf = append(mf, m)
		}
		labels := map[string]string{LabelOwner: OwnerHelm, LabelName: name, LabelVersion: version, LabelStatus: status}
		sec := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Name: ReleaseSecretName("web", 4), Namespace: fuzzNS, ResourceVersion: "42", CreationTimestamp: metav1.NewTime(ts(createdMs)),
				Labels: labels, Annotations: map[string]string{lock.AnnotationRecord: lockAnn}, ManagedFields: mf,
			},
			Type: ReleaseSecretType,
			Data: map[string][]byte{ReleaseDataKey: []byte("payload")},
		}
		r := SecretRecord(sec)
		s, ok := SummarizeMeta(r)

		wantRev, err := strconv.Atoi(version) // out of range: the nearest int
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			wantRev = 0
		}
		if s.Revision != wantRev || records.RevisionOf(labels) != wantRev || r.Revision() != wantRev {
			t.Fatalf("version label %q reads as revision %d, want %d", version, s.Revision, wantRev)
		}
		if want := wantRev > 0 && status != "" && common.Status(status) != common.StatusUnknown; ok != want {
			t.Fatalf("SummarizeMeta(version %q, status %q) ok = %v, want %v", version, status, ok, want)
		}
		if s.Status != common.Status(status) || s.Name != name || s.Namespace != fuzzNS || s.RecordName != sec.Name || s.RecordKind != KindSecret ||
			s.ResourceVersion != "42" || !s.CreationTimestamp.Equal(sec.CreationTimestamp.Time) || s.ContentHash != "" {
			t.Fatalf("SummarizeMeta = %+v", s)
		}
		if !s.LastWriteTime.Equal(wantWrite) {
			t.Fatalf("last write %s, want %s (managed fields %+v)", s.LastWriteTime, wantWrite, mf)
		}

		var holder, abandoned string
		var lockRev int
		if rec, _ := lock.DecodeRecord(lockAnn); rec != nil && lockAnn != "" {
			holder, lockRev = rec.Session, rec.Revision
			if rec.Abandoned != nil {
				abandoned = rec.Abandoned.Session
			}
		}
		if s.LockSession != holder || s.LockAbandoned != abandoned || s.LockRevision != lockRev {
			t.Fatalf("lock annotation %q names %q and %q at revision %d, read as %q and %q at %d", lockAnn, holder, abandoned, lockRev, s.LockSession, s.LockAbandoned, s.LockRevision)
		}
		for _, session := range []string{"", holder, abandoned, "s-other"} {
			want := session != "" && (session == holder || session == abandoned)
			if s.CarriesLockOf(session) != want {
				t.Fatalf("CarriesLockOf(%q) = %v, want %v (holder %q, abandoned %q)", session, !want, want, holder, abandoned)
			}
		}

		bare := r
		bare.Meta.Annotations = nil
		if contentHash(bare) != contentHash(r) {
			t.Fatal("an annotation changed the content hash")
		}
	})
}
