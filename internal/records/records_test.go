package records

import (
	"errors"
	"strings"
	"testing"
)

func TestParseDriver(t *testing.T) {
	cases := map[string]struct {
		want    Driver
		noStore bool
		bad     bool
	}{
		"":           {want: DriverSecret},
		"secret":     {want: DriverSecret},
		"secrets":    {want: DriverSecret},
		"configmap":  {want: DriverConfigMap},
		"configmaps": {want: DriverConfigMap},
		"sql":        {noStore: true},
		"memory":     {noStore: true},
		"etcd":       {bad: true},
	}
	for in, c := range cases {
		got, err := ParseDriver(in)
		switch {
		case c.noStore:
			if !errors.Is(err, ErrNoReleaseRecords) {
				t.Errorf("ParseDriver(%q) error = %v; want ErrNoReleaseRecords", in, err)
			}
		case c.bad:
			if err == nil || errors.Is(err, ErrNoReleaseRecords) {
				t.Errorf("ParseDriver(%q) error = %v; want an unknown-driver error", in, err)
			}
		case err != nil || got != c.want:
			t.Errorf("ParseDriver(%q) = %q, %v; want %q", in, got, err, c.want)
		}
	}
	if _, err := ParseDriver("sql"); err == nil || !strings.Contains(err.Error(), "SQL database") {
		t.Errorf("the sql error does not say where the releases are: %v", err)
	}
}
