package helmx

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/release/common"
	rspb "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

// storeWithHelm writes rel through Helm's own Secret driver and returns the
// Secret it produced, so the tests read exactly what Helm writes.
func storeWithHelm(t *testing.T, rel *rspb.Release) *corev1.Secret {
	t.Helper()
	cs := fake.NewClientset()
	d := driver.NewSecrets(cs.CoreV1().Secrets(rel.Namespace))
	key := ReleaseSecretName(rel.Name, rel.Version)
	if err := d.Create(key, rel); err != nil {
		t.Fatalf("helm driver create: %v", err)
	}
	s, err := cs.CoreV1().Secrets(rel.Namespace).Get(context.Background(), key, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func sampleRelease() *rspb.Release {
	first := time.Date(2026, 1, 2, 3, 4, 5, 600000000, time.UTC)
	return &rspb.Release{
		Name:      "web",
		Namespace: "shop",
		Version:   4,
		Info: &rspb.Info{
			FirstDeployed: first,
			LastDeployed:  first.Add(time.Hour),
			Status:        common.StatusPendingUpgrade,
			Description:   "Preparing upgrade",
		},
		Chart: &chart.Chart{Metadata: &chart.Metadata{
			APIVersion: "v2", Name: "nginx", Version: "1.2.3",
		}},
		Config:   map[string]any{"replicas": 3},
		Manifest: "---\nkind: ConfigMap\n",
	}
}

func TestSummarizeReadsWhatHelmWrites(t *testing.T) {
	rel := sampleRelease()
	s := storeWithHelm(t, rel)
	created := time.Date(2026, 1, 2, 4, 0, 0, 0, time.UTC)
	s.CreationTimestamp = metav1.NewTime(created)
	s.ResourceVersion = "42"
	s.ManagedFields = []metav1.ManagedFieldsEntry{
		{Manager: "helm", Time: &metav1.Time{Time: created}},
		{Manager: "helm-autorecover", Time: &metav1.Time{Time: created.Add(90 * time.Second)}},
		{Manager: "no-time"},
	}

	got, err := Summarize(s)
	if err != nil {
		t.Fatal(err)
	}
	want := Summary{
		RecordKind:        KindSecret,
		RecordName:        "sh.helm.release.v1.web.v4",
		RecordNamespace:   "shop",
		Name:              "web",
		Namespace:         "shop",
		Revision:          4,
		Status:            common.StatusPendingUpgrade,
		Description:       "Preparing upgrade",
		ChartName:         "nginx",
		ChartVersion:      "1.2.3",
		FirstDeployed:     rel.Info.FirstDeployed,
		LastDeployed:      rel.Info.LastDeployed,
		CreationTimestamp: created,
		LastWriteTime:     created.Add(90 * time.Second),
		ResourceVersion:   "42",
		ContentHash:       got.ContentHash,
	}
	if len(got.ContentHash) != 64 {
		t.Errorf("ContentHash = %q; want a sha256", got.ContentHash)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Summarize:\n got %+v\nwant %+v", got, want)
	}
}

// TestContentHash: the hash follows the payload and the labels, not the
// annotations the lock is written to.
func TestContentHash(t *testing.T) {
	base := storeWithHelm(t, sampleRelease())
	h := func(s *corev1.Secret) string {
		t.Helper()
		sum, err := Summarize(s)
		if err != nil {
			t.Fatal(err)
		}
		return sum.ContentHash
	}
	annotated := base.DeepCopy()
	annotated.Annotations = map[string]string{"helm-autorecover.io/lock": "{}"}
	annotated.ResourceVersion = "99"
	if h(annotated) != h(base) {
		t.Errorf("an annotation changed the content hash")
	}
	relabelled := base.DeepCopy()
	relabelled.Labels["status"] = "failed"
	if h(relabelled) == h(base) {
		t.Errorf("a label change kept the content hash")
	}
	other := sampleRelease()
	other.Info.Description = "changed"
	if h(storeWithHelm(t, other)) == h(base) {
		t.Errorf("a payload change kept the content hash")
	}
}

// TestRoundTripKeepsUnknownFields is the reason this codec exists: a field a
// newer writer added (at the top, in info, deep in the chart) must survive our
// edit, and stock Helm must still read the result.
func TestRoundTripKeepsUnknownFields(t *testing.T) {
	s := storeWithHelm(t, sampleRelease())
	doc, err := DecodeReleaseJSON(s.Data[ReleaseDataKey])
	if err != nil {
		t.Fatal(err)
	}

	// Add fields Helm's Go types do not have, plus a number that float64
	// would round, to prove values are carried as text.
	var m map[string]any
	dec := json.NewDecoder(strings.NewReader(string(doc)))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	m["x_lock"] = map[string]any{"session": "abc", "revision": 4}
	m["info"].(map[string]any)["x_note"] = "kept"
	m["chart"].(map[string]any)["metadata"].(map[string]any)["x_future"] = []any{"a", "b"}
	m["config"].(map[string]any)["big"] = json.Number("12345678901234567890")
	withExtra, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}

	edited, err := SetInfoFields(withExtra, map[string]any{
		"status":      common.StatusFailed,
		"description": "recovered <by> test & co",
	})
	if err != nil {
		t.Fatal(err)
	}
	payload, err := EncodeReleaseJSON(edited)
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeReleaseJSON(payload)
	if err != nil {
		t.Fatal(err)
	}

	var before, after map[string]any
	mustUnmarshalNumbers(t, withExtra, &before)
	mustUnmarshalNumbers(t, back, &after)
	before["info"].(map[string]any)["status"] = "failed"
	before["info"].(map[string]any)["description"] = "recovered <by> test & co"
	if !reflect.DeepEqual(before, after) {
		t.Errorf("round trip changed more than info.status and info.description:\nbefore %v\nafter  %v", before, after)
	}
	if !strings.Contains(string(back), `"big":12345678901234567890`) {
		t.Errorf("large number was not kept verbatim: %s", back)
	}

	// Stock Helm reads the edited payload.
	s.Data[ReleaseDataKey] = payload
	cs := fake.NewClientset(s)
	rel, err := driver.NewSecrets(cs.CoreV1().Secrets("shop")).Get(s.Name)
	if err != nil {
		t.Fatalf("helm cannot read our payload: %v", err)
	}
	r := rel.(*rspb.Release)
	if r.Info.Status != common.StatusFailed || r.Info.Description != "recovered <by> test & co" || r.Version != 4 || r.Chart.Metadata.Name != "nginx" {
		t.Errorf("helm read status=%q description=%q version=%d", r.Info.Status, r.Info.Description, r.Version)
	}
	if !r.Info.LastDeployed.Equal(sampleRelease().Info.LastDeployed) {
		t.Errorf("last_deployed changed: %v", r.Info.LastDeployed)
	}
}

func mustUnmarshalNumbers(t *testing.T, b []byte, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		t.Fatal(err)
	}
}

func TestDecodeAcceptsUncompressed(t *testing.T) {
	plain := `{"name":"web","version":1,"info":{"status":"deployed","first_deployed":"","last_deployed":""}}`
	doc, err := DecodeReleaseJSON([]byte(base64.StdEncoding.EncodeToString([]byte(plain))))
	if err != nil {
		t.Fatal(err)
	}
	if string(doc) != plain {
		t.Errorf("got %s", doc)
	}
	s, err := Summarize(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "sh.helm.release.v1.web.v1", Namespace: "ns1"},
		Type:       ReleaseSecretType,
		Data:       map[string][]byte{ReleaseDataKey: []byte(base64.StdEncoding.EncodeToString([]byte(plain)))},
	})
	if err != nil {
		t.Fatal(err)
	}
	if s.Namespace != "ns1" || s.Status != common.StatusDeployed || !s.FirstDeployed.IsZero() {
		t.Errorf("got %+v", s)
	}
}

func TestDecodeErrors(t *testing.T) {
	for name, data := range map[string]string{
		"not base64":       "%%%",
		"not json":         base64.StdEncoding.EncodeToString([]byte("hello")),
		"json array":       base64.StdEncoding.EncodeToString([]byte("[1]")),
		"truncated gzip":   base64.StdEncoding.EncodeToString([]byte{0x1f, 0x8b, 0x08, 0, 0}),
		"empty":            "",
		"json null object": base64.StdEncoding.EncodeToString([]byte("null")),
		// JSON allows only its own white space around a document; helm's
		// decoder refuses these too.
		"a no-break space first": base64.StdEncoding.EncodeToString([]byte("\u00a0{\"name\":\"web\"}")),
		"a next-line last":       base64.StdEncoding.EncodeToString([]byte("{\"name\":\"web\"}\u0085")),
	} {
		if _, err := DecodeReleaseJSON([]byte(data)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestSummarizeRejectsOtherSecrets(t *testing.T) {
	for name, s := range map[string]*corev1.Secret{
		"nil":        nil,
		"wrong type": {ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "y"}, Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"release": nil}},
		"no data":    {ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "y"}, Type: ReleaseSecretType},
	} {
		if _, err := Summarize(s); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestNames(t *testing.T) {
	if got := ReleaseSecretName("my-app", 12); got != "sh.helm.release.v1.my-app.v12" {
		t.Errorf("ReleaseSecretName = %q", got)
	}
	if got := HistorySelector("my-app"); got != "owner=helm,name=my-app" {
		t.Errorf("HistorySelector = %q", got)
	}
}

// TestSummarizeMeta: the metadata alone names the revision, its status,
// its server-set times and the lock it carries; labels that do not name a
// status and a revision say so, and the caller reads the whole record.
func TestSummarizeMeta(t *testing.T) {
	created := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	meta := func(labels map[string]string) Record {
		return Record{Kind: KindSecret, Meta: metav1.ObjectMeta{
			Name: ReleaseSecretName("web", 4), Namespace: "shop", ResourceVersion: "42",
			CreationTimestamp: metav1.NewTime(created), Labels: labels,
			Annotations: map[string]string{lock.AnnotationRecord: `{"schema":1,"session":"s-1","abandoned":{"schema":1,"session":"s-0"}}`},
		}}
	}
	s, ok := SummarizeMeta(meta(map[string]string{LabelOwner: OwnerHelm, LabelName: "web", LabelVersion: "4", LabelStatus: "pending-upgrade"}))
	if !ok || s.Name != "web" || s.Namespace != "shop" || s.Revision != 4 || s.Status != "pending-upgrade" ||
		!s.CreationTimestamp.Equal(created) || s.ResourceVersion != "42" || !s.CarriesLockOf("s-1") || !s.CarriesLockOf("s-0") || s.CarriesLockOf("s-2") {
		t.Errorf("SummarizeMeta = %+v, %v", s, ok)
	}
	for _, labels := range []map[string]string{
		{LabelOwner: OwnerHelm, LabelName: "web", LabelVersion: "4"},
		{LabelOwner: OwnerHelm, LabelName: "web", LabelStatus: "deployed"},
		{LabelOwner: OwnerHelm, LabelName: "web", LabelVersion: "x", LabelStatus: "deployed"},
	} {
		if _, ok := SummarizeMeta(meta(labels)); ok {
			t.Errorf("SummarizeMeta(labels %v) ok; want the whole record read", labels)
		}
	}
}

// TestSummarizeReadsFoldedKeysAsHelm: an info object holding keys that are
// equal but for case ("status" and "STATUS", or the long s of "ſtatus")
// is read with the status, description and times helm's own decoder
// (rspb.Release, through helm's Secret driver) reads, whatever their order
// in the document.
func TestSummarizeReadsFoldedKeysAsHelm(t *testing.T) {
	h := newHelmStore()
	for _, info := range []string{
		`{"status":"deployed","STATUS":"pending-upgrade"}`,
		`{"STATUS":"pending-upgrade","status":"deployed"}`,
		`{"status":"pending-upgrade","Status":"deployed"}`,
		`{"Status":"deployed","status":"pending-upgrade"}`,
		`{"sTATUS":"pending-install","status":"failed","STATUS":"deployed"}`,
		`{"ſtatus":"deployed","status":"pending-rollback"}`,
		`{"status":"pending-rollback","ſtatus":"deployed"}`,
		`{"status":"deployed","STATUS":null}`,
		`{"STATUS":"pending-upgrade","status":null}`,
		`{"status":"deployed","status":"uninstalling"}`,
		`{"\u0053TATUS":"pending-upgrade","status":"deployed"}`,
		`{"description":"one","DESCRIPTION":"two","status":"deployed"}`,
		`{"DESCRIPTION":"two","description":"one","status":"deployed"}`,
		`{"first_deployed":"2026-01-02T03:04:05Z","FIRST_DEPLOYED":"2027-01-02T03:04:05Z","status":"deployed"}`,
		`{"LAST_DEPLOYED":"2027-01-02T03:04:05Z","last_deployed":"2026-01-02T03:04:05Z","status":"deployed"}`,
		`{"Last_Deployed":"2027-01-02T03:04:05Z","last_deployed":"","status":"deployed"}`,
	} {
		doc := `{"name":"web","namespace":"shop","version":3,"info":` + info + `}`
		sec := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: ReleaseSecretName("web", 3), Namespace: fuzzNS, Labels: map[string]string{LabelName: "web", LabelOwner: OwnerHelm, LabelVersion: "3"}},
			Type:       ReleaseSecretType,
			Data:       map[string][]byte{ReleaseDataKey: []byte(base64.StdEncoding.EncodeToString([]byte(doc)))},
		}
		helmRel, helmErr := h.read(sec)
		sum, err := Summarize(sec)
		if helmErr != nil {
			if err == nil {
				t.Errorf("info %s: helm cannot read it (%v), Summarize reads %q", info, helmErr, sum.Status)
			}
			continue
		}
		if err != nil {
			t.Errorf("info %s: helm reads %q, Summarize fails: %v", info, helmRel.Info.Status, err)
			continue
		}
		t.Run(info, func(t *testing.T) { checkSummary(t, sum, helmRel, sec) })
	}
}

// TestReleaseHooks: the hooks of a revision helm stored, with the
// namespace each is created in (its manifest's, or the release's).
func TestReleaseHooks(t *testing.T) {
	rel := sampleRelease()
	rel.Hooks = []*rspb.Hook{
		{Name: "web-migrate", Kind: "Job", Manifest: "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: web-migrate\n", Events: []rspb.HookEvent{rspb.HookPreUpgrade}},
		{Name: "web-check", Kind: "Pod", Manifest: "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web-check\n  namespace: tools\n", Events: []rspb.HookEvent{rspb.HookPostUpgrade}},
		{Name: "web-odd", Kind: "Job", Manifest: "{not yaml", Events: []rspb.HookEvent{rspb.HookPostUpgrade}},
		{Kind: "Job", Manifest: "apiVersion: batch/v1\nkind: Job\nmetadata:\n  generateName: web-seed-\n", Events: []rspb.HookEvent{rspb.HookPostUpgrade}},
	}
	got, err := ReleaseHooks(SecretRecord(storeWithHelm(t, rel)), "shop")
	if err != nil {
		t.Fatal(err)
	}
	want := []HookRef{
		{Kind: "Job", Namespace: "shop", Name: "web-migrate"},
		{Kind: "Pod", Namespace: "tools", Name: "web-check"},
		{Kind: "Job", Namespace: "shop", Name: "web-odd"},
		{Kind: "Job", Namespace: "shop", GenerateName: "web-seed-"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("hooks %+v; want %+v", got, want)
	}
}
