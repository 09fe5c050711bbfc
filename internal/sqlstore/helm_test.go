package sqlstore

import (
	"strings"
	"testing"
)

// TestCheckHelmPool: this build's helm keeps its sql driver's pool where
// OpenHelm reaches it to close it (a helm bump that moves it fails here,
// before any release).
func TestCheckHelmPool(t *testing.T) {
	if err := CheckHelmPool(); err != nil {
		t.Fatal(err)
	}
}

func TestWithDefault(t *testing.T) {
	for _, tc := range []struct{ dsn, want string }{
		{"host=db user=helm", "host=db user=helm connect_timeout='10'"},
		{"host=db connect_timeout=3", "host=db connect_timeout=3"},
		{"postgres://helm@db/helm?sslmode=disable", "postgres://helm@db/helm?connect_timeout=10&sslmode=disable"},
		{"postgresql://helm@db/helm?connect_timeout=3", "postgresql://helm@db/helm?connect_timeout=3"},
	} {
		got, err := withDefault(tc.dsn, "connect_timeout", "10")
		if err != nil || got != tc.want {
			t.Errorf("withDefault(%q) = %q, %v; want %q", tc.dsn, got, err, tc.want)
		}
	}
	if _, err := withDefault("host='db", "connect_timeout", "10"); err == nil || !strings.Contains(err.Error(), EnvConnectionString) {
		t.Errorf("an unparsable connection string: %v", err)
	}
}
