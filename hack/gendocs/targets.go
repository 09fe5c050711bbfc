package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/guard"
)

// target is one generated part: a whole file, or the block between the
// markers of block in it.
type target struct {
	file   string
	block  string
	render func(root string) (string, error)
}

func targets() []target {
	return []target{
		{file: "README.md", block: "flags", render: flagsTable},
		{file: "docs/exit-codes.md", render: exitCodes},
		{file: "docs/protocol.md", block: "lock record", render: recordTable},
	}
}

// replaceBlock puts content between the markers of block in doc.
func replaceBlock(doc, block, content string) (string, error) {
	begin := fmt.Sprintf("<!-- BEGIN generated: %s (go run ./hack/gendocs) -->\n", block)
	end := fmt.Sprintf("<!-- END generated: %s -->", block)
	i := strings.Index(doc, begin)
	j := strings.Index(doc, end)
	if i < 0 || j < i {
		return "", fmt.Errorf("no block %q: want the lines %q and %q", block, strings.TrimSpace(begin), end)
	}
	return doc[:i+len(begin)] + content + doc[j:], nil
}

// flagsTable is the table of the guard's flags, in the order they are
// defined, as a fresh process without HELM_AUTORECOVER_* variables sees
// them.
func flagsTable(string) (string, error) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "HELM_AUTORECOVER_") {
			if err := os.Unsetenv(k); err != nil {
				return "", err
			}
		}
	}
	fs := pflag.NewFlagSet("guard", pflag.ContinueOnError)
	fs.SortFlags = false
	opts := &guard.Options{}
	if err := opts.AddFlags(fs); err != nil {
		return "", err
	}
	opts.AddPreemptFlag(fs) // the guarded commands' alone
	var b strings.Builder
	b.WriteString("| flag (env) | default | meaning |\n| --- | --- | --- |\n")
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		usage, env, ok := strings.Cut(f.Usage, " [")
		env = strings.TrimSuffix(env, "]")
		if !ok || !strings.HasPrefix(env, "HELM_AUTORECOVER_") {
			err = fmt.Errorf("the usage of --%s does not end with its variable in brackets: %q", f.Name, f.Usage)
			return
		}
		fmt.Fprintf(&b, "| `--%s` (`%s`) | `%s` | %s |\n", f.Name, env, shortDefault(f), usage)
	})
	return b.String(), err
}

// shortDefault writes a duration's default as a person would: 15m, not
// 15m0s; 0, not 0s.
func shortDefault(f *pflag.Flag) string {
	v := f.DefValue
	if f.Value.Type() != "duration" {
		return v
	}
	for strings.HasSuffix(v, "m0s") || strings.HasSuffix(v, "h0m") {
		v = strings.TrimSuffix(strings.TrimSuffix(v, "0s"), "0m")
	}
	if v == "0s" {
		v = "0"
	}
	return v
}

// exitCodes is docs/exit-codes.md. Every exit code constant must be
// documented, once.
func exitCodes(root string) (string, error) {
	consts, err := constants(filepath.Join(root, "internal/exitcode/exitcode.go"))
	if err != nil {
		return "", err
	}
	var codes []int
	for _, d := range exitcode.Docs {
		codes = append(codes, d.Code)
	}
	for name, v := range consts {
		if n := countOf(codes, v); n != 1 {
			return "", fmt.Errorf("exit code %s (%d) is documented %d times in exitcode.Docs; want once", name, v, n)
		}
	}
	if len(codes) != len(consts) {
		return "", fmt.Errorf("exitcode.Docs documents %d codes; the package defines %d", len(codes), len(consts))
	}
	var b strings.Builder
	b.WriteString("# Exit codes\n\n<!-- Generated from internal/exitcode (Docs) by go run ./hack/gendocs; edit the code, not this file. -->\n\n")
	b.WriteString("Scripts can rely on these; they are defined in one place, `internal/exitcode`. Every helm failure that is not about the lock\nkeeps helm's own exit code (1, or a plugin's code).\n\n")
	b.WriteString("| code | meaning | what to do |\n| --- | --- | --- |\n")
	for _, d := range exitcode.Docs {
		fmt.Fprintf(&b, "| %d | %s | %s |\n", d.Code, d.Meaning, d.Action)
	}
	return b.String(), nil
}

func countOf(xs []int, v int) int {
	n := 0
	for _, x := range xs {
		if x == v {
			n++
		}
	}
	return n
}

// constants are the integer constants declared in file.
func constants(file string) (map[string]int, error) {
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			for i, n := range vs.Names {
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.INT {
					continue
				}
				v, err := strconv.Atoi(lit.Value)
				if err != nil {
					return nil, err
				}
				out[n.Name] = v
			}
		}
	}
	return out, nil
}

// recordTable is the field table of the lock record: one row per field, by
// its JSON name, with its doc comment; fields declared right after a
// documented one without a comment of their own share its row.
func recordTable(root string) (string, error) {
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(root, "internal/lock/record.go"), nil, parser.ParseComments)
	if err != nil {
		return "", err
	}
	var st *ast.StructType
	ast.Inspect(f, func(n ast.Node) bool {
		if ts, ok := n.(*ast.TypeSpec); ok && ts.Name.Name == "Record" {
			st, _ = ts.Type.(*ast.StructType)
		}
		return st == nil
	})
	if st == nil {
		return "", fmt.Errorf("no struct type Record in internal/lock/record.go")
	}
	type row struct {
		names []string
		doc   string
	}
	var rows []row
	for _, fld := range st.Fields.List {
		tag := ""
		if fld.Tag != nil {
			tag, _ = strconv.Unquote(fld.Tag.Value)
		}
		name, _, _ := strings.Cut(reflect.StructTag(tag).Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		doc := strings.Join(strings.Fields(fld.Doc.Text()), " ")
		switch {
		case doc != "":
			rows = append(rows, row{names: []string{"`" + name + "`"}, doc: doc})
		case len(rows) > 0:
			rows[len(rows)-1].names = append(rows[len(rows)-1].names, "`"+name+"`")
		default:
			return "", fmt.Errorf("field %s of Record has no doc comment", name)
		}
	}
	var b strings.Builder
	b.WriteString("| field | meaning |\n| --- | --- |\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s |\n", strings.Join(r.names, ", "), strings.ReplaceAll(r.doc, "|", "\\|"))
	}
	return b.String(), nil
}
