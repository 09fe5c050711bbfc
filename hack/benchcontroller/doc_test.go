package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteDoc(t *testing.T) {
	block := func(s string) string { return beginDoc + "\n\n" + s + "\n\n" + endDoc }
	for _, c := range []struct {
		name, doc, want, err string
	}{
		{"replaces the block alone", "# T\n\n" + block("old") + "\n\nafter\n", "# T\n\n" + block("new") + "\n\nafter\n", ""},
		{"appends the block when missing", "# T\n", "# T\n\n" + block("new") + "\n", ""},
		{"creates the document", "", block("new") + "\n", ""},
		{"refuses a broken block", "# T\n" + endDoc + "\n" + beginDoc + "\n", "", "is broken"},
		{"refuses a lone marker", "# T\n" + beginDoc + "\n", "", "is broken"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "benchmarks.md")
			if c.doc != "" {
				if err := os.WriteFile(path, []byte(c.doc), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			err := writeDoc(path, "\nnew\n")
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want it to contain %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(path)
			if string(got) != c.want {
				t.Errorf("document:\n%q\nwant\n%q", got, c.want)
			}
		})
	}
}
