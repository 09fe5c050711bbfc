package records

import (
	"cmp"
	"errors"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Fuzz targets for helm's storage labels and driver names as this package
// reads them (issue 14). `make fuzz` runs each for $(FUZZ_TIME); the seeds
// run as plain unit tests.

// FuzzRecordOrder: the version label reads as its number (0 when it is
// not one, the nearest int when out of range, and a number helm writes
// reads back as itself), and Compare is
// a total order on (revision, name), so that every reader takes the same
// record for the newest whatever order the API server lists them in, from
// Secrets and ConfigMaps alike.
func FuzzRecordOrder(f *testing.F) {
	f.Add("sh.helm.release.v1.web.v3", "3", "sh.helm.release.v1.web.v4", "4", "sh.helm.release.v1.web.v10", "10")
	f.Add("sh.helm.release.v1.web.v3", "3", "sh.helm.release.v1.web.v3-copy", "3", "x", "")
	f.Add("a", "-1", "b", "x", "c", "0")
	f.Add("a", "+7", "b", "007", "c", "9223372036854775807")
	f.Add("", "", "", "", "", "")
	f.Fuzz(func(t *testing.T, nameA, verA, nameB, verB, nameC, verC string) {
		type rec struct {
			name   string
			labels map[string]string
		}
		rs := []rec{{nameA, map[string]string{LabelVersion: verA}}, {nameB, map[string]string{LabelVersion: verB}}, {nameC, map[string]string{LabelVersion: verC}}}

		for _, r := range rs {
			v := r.labels[LabelVersion]
			// A number out of int's range reads as the nearest int, as
			// strconv gives it (found by fuzzing: the label
			// "10000000000000000000" is revision MaxInt, not 0).
			want, err := strconv.Atoi(v)
			if err != nil && !errors.Is(err, strconv.ErrRange) {
				want = 0
			}
			if got := RevisionOf(r.labels); got != want {
				t.Fatalf("RevisionOf(version %q) = %d, want %d", v, got, want)
			}
			if got := RevisionOf(map[string]string{LabelVersion: strconv.Itoa(want)}); got != want {
				t.Fatalf("the label helm writes for revision %d reads as %d", want, got)
			}
			sec := FromSecret(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: r.name, Labels: r.labels}})
			cm := FromConfigMap(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: r.name, Labels: r.labels}})
			if sec.Revision() != want || cm.Revision() != want {
				t.Fatalf("Secret and ConfigMap records read revision %d and %d, want %d", sec.Revision(), cm.Revision(), want)
			}
		}
		if got := RevisionOf(nil); got != 0 {
			t.Fatalf("RevisionOf(no labels) = %d", got)
		}

		compare := func(a, b rec) int { return Compare(a.name, a.labels, b.name, b.labels) }
		for _, a := range rs {
			if compare(a, a) != 0 {
				t.Fatalf("Compare(%v, itself) != 0", a)
			}
			for _, b := range rs {
				ab, ba := compare(a, b), compare(b, a)
				if cmp.Compare(ab, 0) != -cmp.Compare(ba, 0) {
					t.Fatalf("Compare is not antisymmetric: %v vs %v: %d, %d", a, b, ab, ba)
				}
				same := RevisionOf(a.labels) == RevisionOf(b.labels) && a.name == b.name
				if (ab == 0) != same {
					t.Fatalf("Compare(%v, %v) = %d; the same revision and name: %v", a, b, ab, same)
				}
				for _, c := range rs {
					if ab <= 0 && compare(b, c) <= 0 && compare(a, c) > 0 {
						t.Fatalf("Compare is not transitive: %v <= %v <= %v but %v > %v", a, b, c, a, c)
					}
				}
			}
		}

		// NewestOf takes the same record in every listing order.
		perms := [][3]int{{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}}
		var first Record
		for i, p := range perms {
			list := make([]Record, 0, 3)
			for _, j := range p {
				list = append(list, FromSecret(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: rs[j].name, Labels: rs[j].labels}}))
			}
			newest, ok := NewestOf(list)
			if !ok {
				t.Fatal("NewestOf(three records) found none")
			}
			for _, r := range list {
				if Compare(newest.Meta.Name, newest.Meta.Labels, r.Meta.Name, r.Meta.Labels) < 0 {
					t.Fatalf("NewestOf chose %q (revision %d) over %q (revision %d)", newest.Meta.Name, newest.Revision(), r.Meta.Name, r.Revision())
				}
			}
			if i == 0 {
				first = newest
			} else if newest.Meta.Name != first.Meta.Name || newest.Revision() != first.Revision() {
				t.Fatalf("NewestOf depends on the listing order: %q v%d, then %q v%d", first.Meta.Name, first.Revision(), newest.Meta.Name, newest.Revision())
			}
		}
		if _, ok := NewestOf(nil); ok {
			t.Fatal("NewestOf(nothing) found a record")
		}
	})
}

// FuzzParseDriver: every HELM_DRIVER value maps onto the secret or
// configmap driver, or fails; only sql and memory fail with
// ErrNoReleaseRecords; a driver's own name maps onto itself; and the store
// of a driver keeps its records in the kind that driver names.
func FuzzParseDriver(f *testing.F) {
	for _, s := range []string{"", "secret", "secrets", "configmap", "configmaps", "sql", "memory", "Secret", "etcd", " secret"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDriver(s)
		noRecords := errors.Is(err, ErrNoReleaseRecords)
		if noRecords != (s == "sql" || s == "memory") {
			t.Fatalf("ParseDriver(%q) = %v: ErrNoReleaseRecords is for sql and memory alone", s, err)
		}
		store, serr := ForHelmDriver(nil, s)
		if (serr == nil) != (err == nil) {
			t.Fatalf("ParseDriver(%q) = %v but ForHelmDriver = %v", s, err, serr)
		}
		if err != nil {
			if d != "" || err.Error() == "" {
				t.Fatalf("ParseDriver(%q) = %q with %v", s, d, err)
			}
			return
		}
		again, err := ParseDriver(string(d))
		if err != nil || again != d {
			t.Fatalf("ParseDriver(%q) = %q, which parses as %q, %v", s, d, again, err)
		}
		switch d {
		case DriverSecret:
			if store.Kind() != KindSecret || store.Resource() != "secrets" || store.Kubectl() != "kubectl get secret" {
				t.Fatalf("ParseDriver(%q) = secret, store %s %s %q", s, store.Kind(), store.Resource(), store.Kubectl())
			}
		case DriverConfigMap:
			if store.Kind() != KindConfigMap || store.Resource() != "configmaps" || store.Kubectl() != "kubectl get configmap" {
				t.Fatalf("ParseDriver(%q) = configmap, store %s %s %q", s, store.Kind(), store.Resource(), store.Kubectl())
			}
		default:
			t.Fatalf("ParseDriver(%q) = %q, not a driver with Kubernetes records", s, d)
		}
	})
}
