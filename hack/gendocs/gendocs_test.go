package main

import "testing"

// TestDocsAreCurrent fails when a part of the docs generated from the code
// (the README's flag table, docs/exit-codes.md, the lock record's fields in
// docs/protocol.md) no longer matches it: run make docs.
func TestDocsAreCurrent(t *testing.T) {
	stale, err := run("../..", false)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range stale {
		t.Errorf("%s is stale: run make docs (go run ./hack/gendocs)", f)
	}
}
