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
			"host='/tmp' dbname='h' user='helm' sslmode='disable' options='-c helm_autorecover.session=S'",
		},
		{
			"pairs with options", "dbname=h options='-c search_path=x'",
			"dbname='h' options='-c search_path=x -c helm_autorecover.session=S'",
		},
		{
			"pairs replacing a session", "dbname=h options='-c helm_autorecover.session=OLD -c a=b'",
			"dbname='h' options='-c a=b -c helm_autorecover.session=S'",
		},
		{
			"quoted values", `password='it\'s a secret' dbname = h`,
			`password='it\'s a secret' dbname='h' options='-c helm_autorecover.session=S'`,
		},
		{
			"url", "postgres://helm@localhost:5432/h?sslmode=disable",
			"postgres://helm@localhost:5432/h?options=-c+helm_autorecover.session%3DS&sslmode=disable",
		},
		{
			"url replacing a session", "postgresql://helm@localhost/h?options=-chelm_autorecover.session%3DOLD",
			"postgresql://helm@localhost/h?options=-c+helm_autorecover.session%3DS",
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
	// is kept.
	t.Setenv("PGOPTIONS", "-c search_path=helm")
	for in, want := range map[string]string{
		"dbname=h":                  "dbname='h' options='-c search_path=helm -c helm_autorecover.session=S'",
		"postgres://localhost/h":    "postgres://localhost/h?options=-c+search_path%3Dhelm+-c+helm_autorecover.session%3DS",
		"dbname=h options='-c a=b'": "dbname='h' options='-c a=b -c helm_autorecover.session=S'",
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
