package helmx

import (
	"context"
	"errors"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/release/common"
	rspb "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/helm-autorecover/helm-autorecover/internal/records"
)

// TestRecordsReadWhatEachHelmDriverWrites: helm's secret and configmap
// drivers store the same release; Records of the matching driver reads the
// same history from each, and nothing from the other kind.
func TestRecordsReadWhatEachHelmDriverWrites(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		helmDriver, kind, other string
	}{
		{"", KindSecret, "configmap"},
		{"secrets", KindSecret, "configmap"},
		{"configmap", KindConfigMap, "secret"},
		{"configmaps", KindConfigMap, "secret"},
	} {
		cs := fake.NewClientset()
		var d driver.Driver = driver.NewSecrets(cs.CoreV1().Secrets("shop"))
		if tc.kind == KindConfigMap {
			d = driver.NewConfigMaps(cs.CoreV1().ConfigMaps("shop"))
		}
		for v, st := range []common.Status{common.StatusSuperseded, common.StatusDeployed, common.StatusPendingUpgrade} {
			rel := sampleRelease()
			rel.Version, rel.Info.Status = v+1, st
			if err := d.Create(ReleaseSecretName(rel.Name, rel.Version), rel); err != nil {
				t.Fatalf("%s: helm's driver: %v", tc.kind, err)
			}
		}
		recs, err := NewRecords(cs, tc.helmDriver)
		if err != nil {
			t.Fatalf("NewRecords(%q): %v", tc.helmDriver, err)
		}
		if recs.Kind() != tc.kind {
			t.Errorf("NewRecords(%q).Kind() = %s, want %s", tc.helmDriver, recs.Kind(), tc.kind)
		}
		hist, err := ReadHistory(ctx, recs, "shop", "web")
		if err != nil {
			t.Fatalf("%s: %v", tc.kind, err)
		}
		if len(hist) != 3 || hist[2].Status != common.StatusPendingUpgrade || hist[2].Revision != 3 || hist[0].Revision != 1 {
			t.Fatalf("%s: history %+v", tc.kind, hist)
		}
		if hist[2].RecordKind != tc.kind || hist[2].RecordName != "sh.helm.release.v1.web.v3" {
			t.Errorf("%s: latest %+v", tc.kind, hist[2])
		}
		other, _ := NewRecords(cs, tc.other)
		if h, err := ReadHistory(ctx, other, "shop", "web"); err != nil || len(h) != 0 {
			t.Errorf("%s records read %d revisions of %s records (err %v)", other.Kind(), len(h), tc.kind, err)
		}

		// An update through Records keeps what helm wrote, and helm reads it.
		r, err := recs.Get(ctx, "shop", hist[2].RecordName)
		if err != nil {
			t.Fatal(err)
		}
		doc, err := DecodeReleaseJSON(r.Payload)
		if err != nil {
			t.Fatal(err)
		}
		if doc, err = SetInfoFields(doc, map[string]any{"status": common.StatusFailed}); err != nil {
			t.Fatal(err)
		}
		if r.Payload, err = EncodeReleaseJSON(doc); err != nil {
			t.Fatal(err)
		}
		r.Meta.Labels[LabelStatus] = "failed"
		if _, err := recs.Update(ctx, r, "test"); err != nil {
			t.Fatalf("%s: update: %v", tc.kind, err)
		}
		got, err := d.Get(hist[2].RecordName)
		if err != nil {
			t.Fatal(err)
		}
		if rel := got.(*rspb.Release); rel.Info.Status != common.StatusFailed || rel.Chart.Metadata.Name != "nginx" {
			t.Errorf("%s: helm reads %s %v", tc.kind, rel.Info.Status, rel.Chart.Metadata)
		}
		if ref := r.Ref(); ref.Kind != tc.kind || ref.Name != hist[2].RecordName || ref.Namespace != "shop" {
			t.Errorf("%s: ref %+v", tc.kind, ref)
		}
	}
}

// TestNewRecordsWithoutKubernetesRecords: sql and memory keep no record;
// the error says so and names the backend to use.
func TestNewRecordsWithoutKubernetesRecords(t *testing.T) {
	for _, d := range []string{"sql", "memory"} {
		if _, err := NewRecords(fake.NewClientset(), d); !errors.Is(err, records.ErrNoReleaseRecords) {
			t.Errorf("NewRecords(%q) = %v, want ErrNoReleaseRecords", d, err)
		}
	}
	if _, err := NewRecords(fake.NewClientset(), "etcd"); err == nil {
		t.Errorf("NewRecords(etcd) accepted an unknown driver")
	}
}

// TestReadHistorySkipsUnreadableRecords: a record labelled as a revision of
// the release whose payload is not a release is skipped, as helm's storage
// skips it, unless it is the newest record (which may carry a live
// holder's lock): then the history cannot be read.
func TestReadHistorySkipsUnreadableRecords(t *testing.T) {
	ctx := context.Background()
	corrupt := func(rev string) *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Name: "sh.helm.release.v1." + sampleRelease().Name + ".v" + rev, Namespace: "shop",
				Labels: map[string]string{LabelOwner: OwnerHelm, LabelName: sampleRelease().Name, LabelVersion: rev},
			},
			Type: ReleaseSecretType,
			Data: map[string][]byte{ReleaseDataKey: []byte("not a release")},
		}
	}
	setup := func(corruptRev string) Records {
		cs := fake.NewClientset(corrupt(corruptRev))
		d := driver.NewSecrets(cs.CoreV1().Secrets("shop"))
		for v, st := range []common.Status{common.StatusSuperseded, common.StatusDeployed} {
			rel := sampleRelease()
			rel.Version, rel.Info.Status = v+1, st
			if err := d.Create(ReleaseSecretName(rel.Name, rel.Version), rel); err != nil {
				t.Fatal(err)
			}
		}
		return SecretRecords(cs)
	}

	hist, err := ReadHistory(ctx, setup("0"), "shop", sampleRelease().Name)
	if err != nil || len(hist) != 2 || hist[0].Revision != 1 || hist[1].Revision != 2 {
		t.Fatalf("history with an unreadable v0: %+v, %v; want revisions 1 and 2", hist, err)
	}
	if _, err := ReadHistory(ctx, setup("3"), "shop", sampleRelease().Name); err == nil || !strings.Contains(err.Error(), "newest record is unreadable") {
		t.Fatalf("history with an unreadable newest record: %v; want a refusal", err)
	}
}
