package protocol

import (
	"errors"
	"slices"
	"testing"
)

func TestDecideAuto(t *testing.T) {
	cases := map[string]struct {
		allowed     map[string]bool
		err         error
		want        string
		wantMissing []string
	}{
		"all lease verbs":  {allowed: map[string]bool{"get": true, "create": true, "update": true}, want: BackendLease},
		"no update":        {allowed: map[string]bool{"get": true, "create": true}, want: BackendRelease, wantMissing: []string{"update"}},
		"nothing":          {allowed: map[string]bool{}, want: BackendRelease, wantMissing: []string{"get", "create", "update"}},
		"review failed":    {err: errors.New("forbidden"), want: BackendRelease},
		"explicit refusal": {allowed: map[string]bool{"get": false, "create": true, "update": true}, want: BackendRelease, wantMissing: []string{"get"}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			got := DecideAuto(c.allowed, c.err)
			if got.Backend != c.want || !slices.Equal(got.Missing, c.wantMissing) {
				t.Fatalf("DecideAuto = %+v; want backend %s, missing %v", got, c.want, c.wantMissing)
			}
			if got.Reason == "" {
				t.Fatal("no reason given")
			}
		})
	}
}
