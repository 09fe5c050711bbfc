// Command gendocs writes the parts of the docs that are copies of the code:
// the README's table of the guard's flags (from their definitions), the
// whole of docs/exit-codes.md (from internal/exitcode.Docs), and the lock
// record's field table in docs/protocol.md (from the Record type's field
// comments). With -check it writes nothing and fails when a file is stale;
// its test does the same in `make test`, so CI fails on a stale doc.
//
//	go run ./hack/gendocs          # make docs
//	go run ./hack/gendocs -check
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
)

func main() {
	root := flag.String("root", ".", "the repository's root")
	check := flag.Bool("check", false, "write nothing; exit 1 when a generated part is stale")
	flag.Parse()
	stale, err := run(*root, !*check)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gendocs: %v\n", err)
		os.Exit(1)
	}
	for _, f := range stale {
		if *check {
			fmt.Fprintf(os.Stderr, "gendocs: %s is stale: run make docs\n", f)
		} else {
			fmt.Fprintf(os.Stderr, "gendocs: wrote %s\n", f)
		}
	}
	if *check && len(stale) > 0 {
		os.Exit(1)
	}
}

// run renders every target and returns the files whose content differs
// from it, writing them when write is set.
func run(root string, write bool) ([]string, error) {
	var stale []string
	for _, t := range targets() {
		path := filepath.Join(root, t.file)
		old, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		content, err := t.render(root)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", t.file, err)
		}
		updated := content
		if t.block != "" {
			if updated, err = replaceBlock(string(old), t.block, content); err != nil {
				return nil, fmt.Errorf("%s: %w", t.file, err)
			}
		}
		if updated == string(old) {
			continue
		}
		stale = append(stale, t.file)
		if write {
			if err := os.WriteFile(path, []byte(updated), 0o644); err != nil {
				return nil, err
			}
		}
	}
	return stale, nil
}
