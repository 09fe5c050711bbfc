package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// commitRef is a word of a document that names a commit of this repository.
type commitRef struct {
	line int
	id   string
}

// hexWord is a run of lower-case hex digits between two characters that are
// not letters, digits or '_' (or the line's ends).
var hexWord = regexp.MustCompile(`[0-9a-f]+`)

// uuid matches a UUID, whose first group would pass for a short commit id.
var uuid = regexp.MustCompile(`[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}`)

// commitRefs returns the words of text that name a commit, by this rule: a
// word of 7 to 40 lower-case hex digits with at least one digit 0-9 and one
// letter a-f (so neither a number nor an English word like "defaced"), not
// part of a longer word (a 64-digit sha256 sum is one word too long), not
// right after "sha256:", "sha512:" or "sha1:" (a digest cut short), and
// not inside a URL (one may name another project's commit) or a UUID. A
// "-dirty" after the id is not part of it.
func commitRefs(text string) []commitRef {
	var refs []commitRef
	for i, line := range strings.Split(text, "\n") {
		skip := uuid.FindAllStringIndex(line, -1)
		for _, f := range strings.Fields(line) {
			if strings.Contains(f, "://") {
				at := strings.Index(line, f)
				skip = append(skip, []int{at, at + len(f)})
			}
		}
		for _, m := range hexWord.FindAllStringIndex(line, -1) {
			start, end := m[0], m[1]
			word := line[start:end]
			if len(word) < 7 || len(word) > 40 ||
				!strings.ContainsAny(word, "0123456789") || !strings.ContainsAny(word, "abcdef") ||
				(start > 0 && isWordByte(line[start-1])) || (end < len(line) && isWordByte(line[end])) {
				continue
			}
			before := line[:start]
			if strings.HasSuffix(before, "sha256:") || strings.HasSuffix(before, "sha512:") || strings.HasSuffix(before, "sha1:") {
				continue
			}
			if slices.ContainsFunc(skip, func(s []int) bool { return start >= s[0] && end <= s[1] }) {
				continue
			}
			refs = append(refs, commitRef{line: i + 1, id: word})
		}
	}
	return refs
}

func isWordByte(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

func TestCommitRefs(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       []commitRef
	}{
		{"short id in prose", "measured at 4cc3219 on 2 cores", []commitRef{{1, "4cc3219"}}},
		{"dirty build", "helm-autorecover 0adce42-dirty, stock", []commitRef{{1, "0adce42"}}},
		{"range", "Since de34bbc..ed55526, a waiter", []commitRef{{1, "de34bbc"}, {1, "ed55526"}}},
		{"full id", "commit 31fcc3193d0d9b1b7c4f1f6f6c2f2b6b2a9d1e00 is", []commitRef{{1, "31fcc3193d0d9b1b7c4f1f6f6c2f2b6b2a9d1e00"}}},
		{"in backquotes, second line", "x\n`git worktree add /tmp/old 56a58d9`", []commitRef{{2, "56a58d9"}}},
		{"too short", "abc1234 is one, abc123 is not", []commitRef{{1, "abc1234"}}},
		{"a number", "seeds 1234567 to 9999999", nil},
		{"an English word", "a defaced accede", nil},
		{"upper case", "ABC1234", nil},
		{"inside a longer word", "x4cc3219 4cc3219y v4cc3219 4cc3219_a", nil},
		{"sha256 sum", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855  file", nil},
		{"digest cut short", "image@sha256:e3b0c44298fc1c1 and sha1:abc1234", nil},
		{"URL", "see https://github.com/helm/helm/commit/abc1234def and 5d6e7f8", []commitRef{{1, "5d6e7f8"}}},
		{"UUID", "uid 123e4567-e89b-12d3-a456-426614174000", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := commitRefs(tc.text)
			if !slices.Equal(got, tc.want) {
				t.Errorf("commitRefs(%q) = %v, want %v", tc.text, got, tc.want)
			}
		})
	}
}

// TestDocsNameKnownCommits fails when README.md, CHANGELOG.md or a file of
// docs/*.md names a commit (commitRefs' rule) that is not in the history of
// HEAD: a figure must name a commit anyone can check out (a commit
// rewritten by a rebase, or one that never landed, is gone from a fresh
// clone). It needs the whole history: in a shallow clone it fails and says
// how to fetch the rest (CI clones in full).
func TestDocsNameKnownCommits(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	shallow, err := git(root, "rev-parse", "--is-shallow-repository")
	if err != nil {
		t.Fatalf("the docs' commit ids are checked against git's history, and git cannot read it in %s: %v", root, err)
	}
	if shallow == "true" {
		t.Fatalf("%s is a shallow clone: the commits the docs name may be cut off from its history; run git fetch --unshallow, then the test again", root)
	}
	files := []string{"README.md", "CHANGELOG.md"}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		files = append(files, filepath.Join("docs", filepath.Base(d)))
	}
	checked := map[string]error{}
	for _, f := range files {
		text, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range commitRefs(string(text)) {
			bad, seen := checked[r.id]
			if !seen {
				bad = inHistory(root, r.id)
				checked[r.id] = bad
			}
			if bad != nil {
				t.Errorf("%s:%d names commit %s, which %v: name a commit of main's history (git log), or say the figure was measured at an earlier version and when", f, r.line, r.id, bad)
			}
		}
	}
	if len(checked) == 0 {
		t.Fatal("no commit id found in the docs: the pattern or the file list is wrong")
	}
}

// inHistory says why id is not a commit of HEAD's history, or nil.
func inHistory(root, id string) error {
	if _, err := git(root, "cat-file", "-e", id+"^{commit}"); err != nil {
		return errors.New("git does not know (git cat-file -e " + id + "^{commit})")
	}
	if _, err := git(root, "merge-base", "--is-ancestor", id, "HEAD"); err != nil {
		return fmt.Errorf("is not in the history of HEAD (git merge-base --is-ancestor %s HEAD: %w)", id, err)
	}
	return nil
}

func git(dir string, args ...string) (string, error) {
	var stderr bytes.Buffer
	cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}
