package sqlstore

import (
	"errors"
	"testing"
)

// TestWithSession: the session goes into the connection's options in
// either form lib/pq reads, replaces an earlier one, and keeps the rest.
func TestWithSession(t *testing.T) {
	t.Setenv("PGOPTIONS", "")
	cases := []struct {
		name, in, want string
	}{
		{
			"pairs", "host=/tmp dbname=h user=helm sslmode=disable",
			"host='/tmp' dbname='h' user='helm' sslmode='disable' options='-c helm_autorecover.session=S -c idle_in_transaction_session_timeout=5s'",
		},
		{
			"pairs with options", "dbname=h options='-c search_path=x'",
			"dbname='h' options='-c search_path=x -c helm_autorecover.session=S -c idle_in_transaction_session_timeout=5s'",
		},
		{
			"pairs replacing a session", "dbname=h options='-c helm_autorecover.session=OLD -c a=b'",
			"dbname='h' options='-c a=b -c helm_autorecover.session=S -c idle_in_transaction_session_timeout=5s'",
		},
		{
			"quoted values", `password='it\'s a secret' dbname = h`,
			`password='it\'s a secret' dbname='h' options='-c helm_autorecover.session=S -c idle_in_transaction_session_timeout=5s'`,
		},
		{
			"url", "postgres://helm@localhost:5432/h?sslmode=disable",
			"postgres://helm@localhost:5432/h?options=-c+helm_autorecover.session%3DS+-c+idle_in_transaction_session_timeout%3D5s&sslmode=disable",
		},
		{
			"url replacing a session", "postgresql://helm@localhost/h?options=-chelm_autorecover.session%3DOLD",
			"postgresql://helm@localhost/h?options=-c+helm_autorecover.session%3DS+-c+idle_in_transaction_session_timeout%3D5s",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := WithSession(c.in, "S")
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Fatalf("WithSession(%q)\n got %q\nwant %q", c.in, got, c.want)
			}
		})
	}
	// PGOPTIONS, which lib/pq reads only when the string names no options,
	// is kept; a limit of the user's own is not overridden.
	t.Setenv("PGOPTIONS", "-c search_path=helm -c idle_in_transaction_session_timeout=1min")
	for in, want := range map[string]string{
		"dbname=h":                  "dbname='h' options='-c search_path=helm -c idle_in_transaction_session_timeout=1min -c helm_autorecover.session=S'",
		"postgres://localhost/h":    "postgres://localhost/h?options=-c+search_path%3Dhelm+-c+idle_in_transaction_session_timeout%3D1min+-c+helm_autorecover.session%3DS",
		"dbname=h options='-c a=b'": "dbname='h' options='-c a=b -c helm_autorecover.session=S -c idle_in_transaction_session_timeout=5s'",
	} {
		if got, err := WithSession(in, "S"); err != nil || got != want {
			t.Errorf("with PGOPTIONS, WithSession(%q)\n got %q, %v\nwant %q", in, got, err, want)
		}
	}
	if _, err := WithSession("", "S"); !errors.Is(err, ErrNoConnectionString) {
		t.Errorf("WithSession of no connection string = %v, want ErrNoConnectionString", err)
	}
	for _, bad := range []string{"dbname", "dbname='h", "=x"} {
		if _, err := WithSession(bad, "S"); err == nil {
			t.Errorf("WithSession(%q) succeeded; want an error", bad)
		}
	}
}
