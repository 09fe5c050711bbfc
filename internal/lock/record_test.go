package lock

import (
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

func TestRecordRoundTrip(t *testing.T) {
	in := Record{
		Schema: SchemaVersion, Session: "5d1f", Operation: OpUpgrade, Release: "web", Namespace: "prod",
		Revision: 7, Who: "alice@laptop", PID: 4242, ToolVersion: "v1.2.3", CIJobURL: "https://ci/job/1",
		Timeout: metav1.Duration{Duration: 5 * time.Minute}, LeaseDuration: metav1.Duration{Duration: 15 * time.Second},
		AcquiredAt: at(0), RenewedAt: at(5 * time.Second), LockedTill: at(20 * time.Second), MaxHoldUntil: at(time.Hour),
	}
	s, err := in.Encode()
	if err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{`"schema":1`, `"timeout":"5m0s"`, `"leaseDuration":"15s"`, `"lockedTill":"2026-03-14T15:09:46Z"`} {
		if !strings.Contains(s, field) {
			t.Errorf("encoded record %s lacks %s", s, field)
		}
	}
	if strings.Contains(s, "releasedAt") {
		t.Errorf("encoded record %s carries an unset releasedAt", s)
	}
	out, err := DecodeRecord(s)
	if err != nil {
		t.Fatal(err)
	}
	if *out != in {
		t.Errorf("round trip:\n got %+v\nwant %+v", *out, in)
	}
}

// TestDecodeRecordCopies: DecodeRecord remembers the records it read last;
// a caller that changes its record, or the record it names as abandoned,
// changes nothing another caller reads.
func TestDecodeRecordCopies(t *testing.T) {
	in := Record{Schema: SchemaVersion, Session: "taker", Revision: 3, Abandoned: &Record{Schema: SchemaVersion, Session: "dead", Revision: 2}}
	s, err := in.Encode()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		r, err := DecodeRecord(s)
		if err != nil {
			t.Fatal(err)
		}
		if r.Session != "taker" || r.Revision != 3 || r.Abandoned == nil || r.Abandoned.Session != "dead" || r.Abandoned.Stopped {
			t.Fatalf("read %d: %+v (abandoned %+v), want the record as encoded", i, r, r.Abandoned)
		}
		r.Session, r.Revision, r.Abandoned.Session, r.Abandoned.Stopped = "changed", 9, "changed", true
	}
	if _, err := DecodeRecord(`{"schema":2,"session":"s"}`); !errors.Is(err, ErrUnsupportedSchema) {
		t.Fatalf("a newer schema: err = %v", err)
	}
	if _, err := DecodeRecord(`{"schema":2,"session":"s"}`); !errors.Is(err, ErrUnsupportedSchema) {
		t.Fatalf("a newer schema read again: err = %v, want it flagged again", err)
	}
}

func TestDecodeRecordSchemas(t *testing.T) {
	cases := []struct {
		name        string
		in          string
		wantSession string
		wantErr     error
	}{
		{name: "current", in: `{"schema":1,"session":"s"}`, wantSession: "s"},
		{name: "unknown fields of a newer writer are ignored", in: `{"schema":1,"session":"s","futureField":{"x":1}}`, wantSession: "s"},
		{name: "newer schema is flagged but shown", in: `{"schema":2,"session":"s"}`, wantSession: "s", wantErr: ErrUnsupportedSchema},
		{name: "missing schema is flagged", in: `{"session":"s"}`, wantSession: "s", wantErr: ErrUnsupportedSchema},
		{name: "negative schema is flagged", in: `{"schema":-1,"session":"s"}`, wantSession: "s", wantErr: ErrUnsupportedSchema},
		{name: "not JSON", in: `nope`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := DecodeRecord(tc.in)
			switch {
			case tc.wantSession == "" && err == nil:
				t.Fatal("DecodeRecord accepted garbage")
			case tc.wantErr != nil && !errors.Is(err, tc.wantErr):
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			case tc.wantErr == nil && tc.wantSession != "" && err != nil:
				t.Fatalf("err = %v", err)
			}
			if tc.wantSession != "" && (r == nil || r.Session != tc.wantSession) {
				t.Errorf("record = %+v, want session %q", r, tc.wantSession)
			}
		})
	}
}

func TestDetectCIJobURL(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		want string
	}{
		{name: "none", env: map[string]string{"CI": "true"}, want: ""},
		{name: "override wins", env: map[string]string{EnvCIJobURL: "https://tekton/run/1", "CI_JOB_URL": "https://gitlab/x"}, want: "https://tekton/run/1"},
		{
			name: "github actions",
			env:  map[string]string{"GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "o/r", "GITHUB_RUN_ID": "42", "GITHUB_RUN_ATTEMPT": "1"},
			want: "https://github.com/o/r/actions/runs/42",
		},
		{
			name: "github actions, second attempt, enterprise server",
			env:  map[string]string{"GITHUB_SERVER_URL": "https://ghe.example/", "GITHUB_REPOSITORY": "o/r", "GITHUB_RUN_ID": "42", "GITHUB_RUN_ATTEMPT": "2"},
			want: "https://ghe.example/o/r/actions/runs/42/attempts/2",
		},
		{name: "gitlab", env: map[string]string{"CI_JOB_URL": "https://gitlab.example/g/p/-/jobs/9"}, want: "https://gitlab.example/g/p/-/jobs/9"},
		{name: "jenkins", env: map[string]string{"BUILD_URL": "https://jenkins/job/x/3/"}, want: "https://jenkins/job/x/3/"},
		{name: "buildkite", env: map[string]string{"BUILDKITE_BUILD_URL": "https://buildkite.com/o/p/builds/5"}, want: "https://buildkite.com/o/p/builds/5"},
		{name: "circleci", env: map[string]string{"CIRCLE_BUILD_URL": "https://circleci.com/gh/o/r/8"}, want: "https://circleci.com/gh/o/r/8"},
		{
			name: "azure pipelines",
			env:  map[string]string{"SYSTEM_COLLECTIONURI": "https://dev.azure.com/org/", "SYSTEM_TEAMPROJECT": "My Project", "BUILD_BUILDID": "77"},
			want: "https://dev.azure.com/org/My%20Project/_build/results?buildId=77",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := DetectCIJobURL(func(k string) string { return tc.env[k] }); got != tc.want {
				t.Errorf("DetectCIJobURL() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestLeaseNameEdgeCases(t *testing.T) {
	for _, r := range []string{"a", "0", "web", "my.release-1", strings.Repeat("a", 53), strings.Repeat("a.", 26) + "b", "a-b.c-d.e"} {
		checkLeaseName(t, r)
	}
	for _, r := range []string{"", "Web", "-a", "a-", strings.Repeat("a", 54), "a_b", "a..b"} {
		if ValidateReleaseName(r) == nil {
			t.Errorf("ValidateReleaseName(%q) accepted an illegal release name", r)
		}
	}
}

// FuzzLeaseName checks that every legal release name yields a legal Lease
// name and a legal label value.
func FuzzLeaseName(f *testing.F) {
	for _, s := range []string{"a", "web", "x.y", strings.Repeat("z", 53), "a-1.b-2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, r string) {
		if ValidateReleaseName(r) != nil {
			return
		}
		checkLeaseName(t, r)
	})
}

func checkLeaseName(t *testing.T, release string) {
	t.Helper()
	if err := ValidateReleaseName(release); err != nil {
		t.Fatalf("ValidateReleaseName(%q) = %v", release, err)
	}
	name := LeaseName(release)
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		t.Errorf("LeaseName(%q) = %q is not a legal Lease name: %v", release, name, errs)
	}
	for k, v := range LockLabels(release) {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			t.Errorf("label key %q illegal: %v", k, errs)
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Errorf("label %s=%q illegal for release %q: %v", k, v, release, errs)
		}
	}
}

func TestLockedErrorMessage(t *testing.T) {
	e := &LockedError{
		Release: "web", Namespace: "prod", State: Live, HolderIdentity: "5d1f",
		Holder: &Record{
			Session: "5d1f", Operation: OpUpgrade, Revision: 7, Who: "alice@laptop", PID: 4242,
			AcquiredAt: at(0), CIJobURL: "https://ci/job/1",
		},
		LockedTill: at(20 * time.Second), Left: 12400 * time.Millisecond, Ahead: 2,
	}
	want := `release "web" in namespace "prod" is locked by alice@laptop pid 4242 (session 5d1f, operation upgrade of revision 7, since 2026-03-14T15:09:26Z, job https://ci/job/1), ` +
		`LOCKED TILL 2026-03-14T15:09:46Z (can be taken over in 12s unless renewed), 2 waiter(s) queued; ` +
		`if its holder is dead (process killed, CI job cancelled), release the lock with: helm-autorecover unlock web -n prod --session 5d1f --force; ` +
		`wait for it with --lock-timeout=DURATION, or list locks with "helm-autorecover locks"`
	if got := e.Error(); got != want {
		t.Errorf("message:\n got %s\nwant %s", got, want)
	}
	// After --lock-timeout ran out, the flag is not suggested again; a
	// holder whose pid is not running here is named as such.
	e.Waited, e.HolderNotRunning = 30*time.Second, true
	want = `release "web" in namespace "prod" is locked by alice@laptop pid 4242 (session 5d1f, operation upgrade of revision 7, since 2026-03-14T15:09:26Z, job https://ci/job/1), ` +
		`LOCKED TILL 2026-03-14T15:09:46Z (can be taken over in 12s unless renewed), 2 waiter(s) queued; gave up after waiting 30s (--lock-timeout); ` +
		`its process (pid 4242) is not running on this machine: if no other process works on the release, release the lock with: helm-autorecover unlock web -n prod --session 5d1f --force; ` +
		`list locks with "helm-autorecover locks"`
	if got := e.Error(); got != want {
		t.Errorf("message:\n got %s\nwant %s", got, want)
	}
	if !errors.Is(e, ErrLocked) {
		t.Error("errors.Is(LockedError, ErrLocked) = false")
	}
	queued := &LockedError{Release: "web", Namespace: "prod", State: Free, Ahead: 1}
	want = `release "web" in namespace "prod" is locked: 1 earlier waiter(s) are queued for it; wait for it with --lock-timeout=DURATION, or list locks with "helm-autorecover locks"`
	if got := queued.Error(); got != want {
		t.Errorf("message:\n got %s\nwant %s", got, want)
	}
}
