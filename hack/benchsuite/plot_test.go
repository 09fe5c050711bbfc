package main

import (
	"strings"
	"testing"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
)

// TestFitTitle: no line of a plot's title is wider than the image, however
// long the subtitle (docs/bench/recovery.png once had its machine and
// version line cut at both edges), and no word is lost but one too wide
// for a line of its own, which is cut.
func TestFitTitle(t *testing.T) {
	width := 18 * vg.Centimeter * 96 / 100
	long := "measured 2026-12-05; 2 cores; helm-autorecover 4cc3219-dirty (the binary says: helm-autorecover 4cc3219 (commit \"4cc3219\", go1.26.8), helm SDK v4.3.2 (helm commit \"\")), stock helm v4.3.2, Kubernetes v1.37.2, go1.26.8"
	word := strings.Repeat("x", 300)
	for _, tc := range []struct {
		name, text string
		lines      int // at least
	}{
		{"short", "Recovery after SIGKILL\nmeasured 2026-12-05; 2 cores", 2},
		{"long subtitle", "Recovery after SIGKILL during upgrade --wait\n" + long, 3},
		{"one word too wide", "Title\n" + word, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := plot.New()
			p.Title.TextStyle.Font.Size = vg.Points(9)
			p.Title.Text = tc.text
			fitTitle(p, width)
			lines := strings.Split(p.Title.Text, "\n")
			if len(lines) < tc.lines {
				t.Errorf("%d lines, want at least %d: %q", len(lines), tc.lines, p.Title.Text)
			}
			for _, l := range lines {
				if w := p.Title.TextStyle.Width(l); w > width {
					t.Errorf("line %q is %v wide, more than %v", l, w, width)
				}
			}
			if tc.name != "one word too wide" && strings.Join(strings.Fields(p.Title.Text), " ") != strings.Join(strings.Fields(tc.text), " ") {
				t.Errorf("words changed: %q, want those of %q", p.Title.Text, tc.text)
			}
		})
	}
}

// TestCaptionNote: --replot reads a plot's subtitle from the caption the
// run wrote under it.
func TestCaptionNote(t *testing.T) {
	doc := benchFamily.beginScenario("handoff") + "\n![x](bench/handoff.png)\n\nRaw data: [handoff.csv](bench/handoff.csv). Measured 2026-12-05 04:09 UTC on 2 cores (AMD EPYC), 23.5 GiB memory, Linux 6.18.44-fc-v1272; helm-autorecover 0adce42-dirty, stock helm v4.3.2, Kubernetes v1.37.2, go1.26.8. Rerun: ...\n" + benchFamily.endScenario("handoff") + "\n"
	if got, want := captionNote(doc, "handoff"), "measured 2026-12-05; 2 cores; helm-autorecover 0adce42-dirty, stock helm v4.3.2"; got != want {
		t.Errorf("captionNote = %q, want %q", got, want)
	}
	if got := captionNote(doc, "recovery"); got != "" {
		t.Errorf("captionNote of a scenario not in the document = %q, want empty", got)
	}
}
