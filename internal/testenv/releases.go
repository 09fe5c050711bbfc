package testenv

import (
	"context"
	"sort"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Revision is one stored helm revision as seen from its Secret's labels.
type Revision struct {
	Version int
	Status  string
	Secret  corev1.Secret
}

// History returns the stored revisions of release in ns, oldest first, read
// straight from helm's Secrets (not through any helm code).
func (e *Env) History(t testing.TB, ns, release string) []Revision {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := e.Client.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{
		LabelSelector: "owner=helm,name=" + release,
	})
	if err != nil {
		t.Fatalf("listing release secrets of %s/%s: %v", ns, release, err)
	}
	revs := make([]Revision, 0, len(list.Items))
	for _, s := range list.Items {
		v, _ := strconv.Atoi(s.Labels["version"])
		revs = append(revs, Revision{Version: v, Status: s.Labels["status"], Secret: s})
	}
	sort.Slice(revs, func(i, j int) bool { return revs[i].Version < revs[j].Version })
	return revs
}

// WaitForStatus waits until the latest revision of release is revision rev
// with status, and fails the test after timeout.
func (e *Env) WaitForStatus(t testing.TB, ns, release string, rev int, status string, timeout time.Duration) {
	t.Helper()
	WaitForLatest(t, ns+"/"+release, func() []string { return e.Summary(t, ns, release) }, rev, status, timeout)
}

// WaitForLatest waits until the newest entry of history ("1:deployed
// 2:failed ...", oldest first, as Summary and SQLHistory return it) is
// revision rev with status, and fails the test after timeout, naming what.
func WaitForLatest(t testing.TB, what string, history func() []string, rev int, status string, timeout time.Duration) {
	t.Helper()
	want := strconv.Itoa(rev) + ":" + status
	deadline := time.Now().Add(timeout)
	var last []string
	for time.Now().Before(deadline) {
		if last = history(); len(last) > 0 && last[len(last)-1] == want {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("release %s: revision %d never reached %s within %s; history: %v", what, rev, status, timeout, last)
}

func summarize(revs []Revision) []string {
	out := make([]string, 0, len(revs))
	for _, r := range revs {
		out = append(out, strconv.Itoa(r.Version)+":"+r.Status)
	}
	return out
}

// Summary returns "1:deployed 2:failed ..." for the release's history.
func (e *Env) Summary(t testing.TB, ns, release string) []string {
	t.Helper()
	return summarize(e.History(t, ns, release))
}
