package recovery

import (
	"context"
	"strings"
	"testing"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/records"
	"helm.sh/helm/v4/pkg/release/common"
	rspb "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage/driver"
)

func TestConvergeMethod(t *testing.T) {
	cases := map[string]ApplyMethod{
		"":        ClientSideApply, // helm 3, and helm 4 revisions of helm 3 releases
		"csa":     ClientSideApply,
		"ssa":     ServerSideApply,
		"unknown": ClientSideApply, // helm treats anything but "ssa" as client-side
	}
	for in, want := range cases {
		if got := ConvergeMethod(&rspb.Release{ApplyMethod: in}); got != want {
			t.Errorf("ConvergeMethod(%q) = %q, want %q", in, got, want)
		}
	}
	if got := ConvergeMethod(nil); got != ClientSideApply {
		t.Errorf("ConvergeMethod(nil) = %q", got)
	}
}

func TestConvergeWithoutDeployedRevision(t *testing.T) {
	ab := &rspb.Release{Name: "web", Namespace: "shop", Version: 1, ApplyMethod: "ssa", Manifest: helmManifest}
	rep, err := Converge(context.Background(), nil, ConvergeInput{Abandoned: ab, AbandonedCreated: t0}, ConvergeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Skipped == "" || rep.Changed() || len(rep.Objects) != 0 {
		t.Errorf("report %+v, want skipped with no objects", rep)
	}
	if want := `release "web" in namespace "shop": revision 1 left as it is: no revision is deployed`; !strings.HasPrefix(rep.Summary(), want) {
		t.Errorf("summary %q", rep.Summary())
	}
	if _, err := Converge(context.Background(), nil, ConvergeInput{}, ConvergeOptions{}); err == nil {
		t.Error("Converge without an abandoned revision succeeded")
	}
}

func TestLoadConvergeInput(t *testing.T) {
	ctx := context.Background()
	cs := newFake()
	d := driver.NewSecrets(cs.CoreV1().Secrets("shop"))
	store := func(v int, st common.Status, manifest, method string) {
		r := helmRelease("web", "shop", v, st)
		r.Manifest, r.ApplyMethod = manifest, method
		if err := d.Create(helmx.ReleaseSecretName("web", v), r); err != nil {
			t.Fatal(err)
		}
	}
	store(1, common.StatusSuperseded, "m1", "")
	store(2, common.StatusDeployed, "m2", "csa")
	store(3, common.StatusFailed, "m3", "ssa")
	store(4, common.StatusFailed, "m4", "ssa") // abandoned, already marked failed
	abandoned := helmx.Summary{RecordName: helmx.ReleaseSecretName("web", 4), RecordNamespace: "shop", Name: "web", Namespace: "shop", Revision: 4}

	in, err := LoadConvergeInput(ctx, helmx.SecretRecords(cs), abandoned)
	if err != nil {
		t.Fatal(err)
	}
	if in.Abandoned == nil || in.Abandoned.Version != 4 || in.Abandoned.Manifest != "m4" || ConvergeMethod(in.Abandoned) != ServerSideApply {
		t.Errorf("abandoned %+v", in.Abandoned)
	}
	if in.Base == nil || in.Base.Version != 2 || in.Base.Manifest != "m2" {
		t.Errorf("base %+v, want revision 2 (the deployed one)", in.Base)
	}

	// No deployed revision: no base.
	cs2 := newFake()
	d = driver.NewSecrets(cs2.CoreV1().Secrets("shop"))
	if err := d.Create(helmx.ReleaseSecretName("web", 1), helmRelease("web", "shop", 1, common.StatusFailed)); err != nil {
		t.Fatal(err)
	}
	one := abandoned
	one.RecordName, one.Revision = helmx.ReleaseSecretName("web", 1), 1
	in, err = LoadConvergeInput(ctx, helmx.SecretRecords(cs2), one)
	if err != nil || in.Base != nil || in.Abandoned == nil {
		t.Errorf("pending-install: base %v abandoned %v err %v", in.Base, in.Abandoned, err)
	}

	// The abandoned revision is gone.
	gone := abandoned
	gone.RecordName, gone.Revision = helmx.ReleaseSecretName("web", 9), 9
	if _, err := LoadConvergeInput(ctx, helmx.SecretRecords(cs), gone); err == nil || !strings.Contains(err.Error(), "revision 9 is gone") {
		t.Errorf("missing revision: %v", err)
	}
}

func TestConvergeAbandonedUninstall(t *testing.T) {
	// An interrupted uninstall is never converged: nothing is read or written.
	rep, err := ConvergeAbandoned(context.Background(), nil, records.Store{},
		helmx.Summary{Name: "web", Namespace: "shop", Revision: 3, Status: common.StatusUninstalling}, ConvergeOptions{})
	if err != nil || rep.Skipped == "" || rep.Changed() {
		t.Errorf("report %+v err %v", rep, err)
	}
}
