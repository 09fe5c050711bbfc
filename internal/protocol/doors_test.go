package protocol

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestDoorsImportProtocolOnly: the doors (the CLI, the guarded commands,
// the controller, the Go package) reach the lock through this package
// alone, never the lock engine or a store (docs/architecture.md): a door that
// built its own lock request or armed its own fence would be a second copy
// of the protocol.
func TestDoorsImportProtocolOnly(t *testing.T) {
	const module = "github.com/helm-autorecover/helm-autorecover/internal/"
	forbidden := []string{module + "lock", module + "sqlstore"}
	doors := []string{"../cli", "../guard", "../controller", "../../pkg/autorecover"}
	checked := 0
	for _, dir := range doors {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			parsed, err := parser.ParseFile(token.NewFileSet(), f, src, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			checked++
			for _, imp := range parsed.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				for _, no := range forbidden {
					if path == no || strings.HasPrefix(path, no+"/") {
						t.Errorf("%s imports %s: doors use package protocol", f, path)
					}
				}
			}
		}
	}
	if checked < 20 {
		t.Fatalf("checked %d files of the doors; the paths above must have moved", checked)
	}
}
