package main

import (
	"fmt"
	"image/color"
	"os"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Colours of the plots: stock helm grey, helm-autorecover blue (its
// release-backend variant lighter), goals red.
var (
	colStock       = color.RGBA{R: 140, G: 140, B: 140, A: 255}
	colOurs        = color.RGBA{R: 31, G: 119, B: 180, A: 255}
	colOursRelease = color.RGBA{R: 158, G: 202, B: 225, A: 255}
	colGoal        = color.RGBA{R: 214, G: 39, B: 40, A: 255}
)

// newPlot starts a plot with a short title. The line under it (the
// subtitle) says when, on how many cores and with which builds, in a few
// words; the document's caption below the plot has the machine and the
// versions in full. savePlot fits both to the image's width.
func (s *suite) newPlot(title, xLabel, yLabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	if s.plotNote != "" {
		p.Title.Text += "\n" + s.plotNote
	}
	p.Title.TextStyle.Font.Size = vg.Points(9)
	p.X.Label.Text = xLabel
	p.Y.Label.Text = yLabel
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.Add(plotter.NewGrid())
	return p
}

// fitTitle breaks each line of the title that is wider than width at
// spaces, and cuts a word that alone is wider (ending it with "..."), so
// that no line runs off the image.
func fitTitle(p *plot.Plot, width vg.Length) {
	style := p.Title.TextStyle
	fits := func(line string) bool { return style.Width(line) <= width }
	var out []string
	for _, line := range strings.Split(p.Title.Text, "\n") {
		cur := ""
		for _, word := range strings.Fields(line) {
			for !fits(word) && len(word) > 4 {
				word = strings.TrimSuffix(word, "...")
				word = word[:len(word)-2] + "..."
			}
			switch {
			case cur == "":
				cur = word
			case fits(cur + " " + word):
				cur += " " + word
			default:
				out = append(out, cur)
				cur = word
			}
		}
		out = append(out, cur)
	}
	p.Title.Text = strings.Join(out, "\n")
}

// headroom leaves room above the data for the legend.
func headroom(p *plot.Plot, frac float64) {
	p.Y.Max += (p.Y.Max - p.Y.Min) * frac
}

// savePlot writes a plot as PNG into the data folder.
func (s *suite) savePlot(p *plot.Plot, file string, w, h vg.Length) error {
	if err := os.MkdirAll(s.o.data, 0o755); err != nil {
		return err
	}
	// The title is drawn centred on the whole image: keep a margin of
	// 2 % on each side.
	fitTitle(p, w*96/100)
	if err := p.Save(w, h, s.dataPath(file)); err != nil {
		return fmt.Errorf("plotting %s: %w", file, err)
	}
	return nil
}

// hline is a horizontal line from x0 to x1 at y.
func hline(x0, x1, y float64, c color.Color, dashed bool) (*plotter.Line, error) {
	l, err := plotter.NewLine(plotter.XYs{{X: x0, Y: y}, {X: x1, Y: y}})
	if err != nil {
		return nil, err
	}
	l.Color = c
	l.Width = vg.Points(1.2)
	if dashed {
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	}
	return l, nil
}

// vline is a vertical line from y0 to y1 at x.
func vline(x, y0, y1 float64, c color.Color, dashed bool) (*plotter.Line, error) {
	l, err := hline(0, 0, 0, c, dashed)
	if err != nil {
		return nil, err
	}
	l.XYs = plotter.XYs{{X: x, Y: y0}, {X: x, Y: y1}}
	return l, nil
}

// points is a scatter of xys in colour c with glyph shape g.
func points(xys plotter.XYs, c color.Color, g draw.GlyphDrawer) (*plotter.Scatter, error) {
	sc, err := plotter.NewScatter(xys)
	if err != nil {
		return nil, err
	}
	sc.Color = c
	sc.Shape = g
	sc.Radius = vg.Points(2.5)
	return sc, nil
}

// overheadPlots draws the wall times (boxes) and the requests per
// operation (bars) of every case.
func (s *suite) overheadPlots(r *overheadResult) error {
	stock, ours, oursRelease := s.overheadClients()
	p := s.newPlot("Wall time relative to stock helm's median, per case", "", "wall time / stock helm's median")
	var names []string
	for i, c := range r.cases {
		names = append(names, c.String())
		base := median(r.seconds(c, stock.id))
		for j, cl := range []benchClient{stock, ours} {
			var vs plotter.Values
			for _, x := range r.seconds(c, cl.id) {
				vs = append(vs, x/base)
			}
			if len(vs) == 0 || base == 0 {
				continue
			}
			b, err := plotter.NewBoxPlot(vg.Points(14), float64(i)+[]float64{-0.18, 0.18}[j], vs)
			if err != nil {
				return err
			}
			b.FillColor = []color.Color{colStock, colOurs}[j]
			p.Add(b)
			if i == 0 {
				p.Legend.Add(cl.name, swatch{b.FillColor})
			}
		}
	}
	goal, err := hline(-0.5, float64(len(r.cases))-0.5, 1.10, colGoal, true)
	if err != nil {
		return err
	}
	p.Add(goal)
	p.Legend.Add("goal: 1.10", goal)
	p.NominalX(wrapNames(names)...)
	p.Y.Min = 0
	if err := s.savePlot(p, "overhead.png", 26*vg.Centimeter, 13*vg.Centimeter); err != nil {
		return err
	}

	p = s.newPlot("API requests per operation (median of the counted runs)", "", "requests")
	clients := []benchClient{stock, ours, oursRelease}
	cols := []color.Color{colStock, colOurs, colOursRelease}
	for j, cl := range clients {
		var vs plotter.Values
		for _, c := range r.cases {
			_, t := r.requests(c, cl.id)
			vs = append(vs, t)
		}
		bars, err := plotter.NewBarChart(vs, vg.Points(12))
		if err != nil {
			return err
		}
		bars.Color = cols[j]
		bars.LineStyle.Width = 0
		bars.Offset = vg.Points(float64(j-1) * 13)
		p.Add(bars)
		if err := barLabels(p, vs, bars.Offset); err != nil {
			return err
		}
		p.Legend.Add(cl.name, bars)
	}
	p.NominalX(wrapNames(names)...)
	return s.savePlot(p, "overhead-requests.png", 26*vg.Centimeter, 13*vg.Centimeter)
}

// barLabels writes each bar's value above it.
func barLabels(p *plot.Plot, vs plotter.Values, offset vg.Length) error {
	xys := make(plotter.XYs, len(vs))
	labels := make([]string, len(vs))
	for i, v := range vs {
		xys[i] = plotter.XY{X: float64(i), Y: v}
		labels[i] = num(v)
	}
	l, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: labels})
	if err != nil {
		return err
	}
	for i := range l.TextStyle {
		l.TextStyle[i].Font.Size = vg.Points(7)
		l.TextStyle[i].XAlign = -0.5
		l.Offset = vg.Point{X: offset, Y: vg.Points(2)}
	}
	p.Add(l)
	return nil
}

// wrapNames puts each case's flag on a line of its own.
func wrapNames(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = n
		if len(n) > 14 {
			if j := lastSpace(n); j > 0 {
				out[i] = n[:j] + "\n" + n[j+1:]
			}
		}
	}
	return out
}

func lastSpace(s string) int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == ' ' {
			return i
		}
	}
	return -1
}

// swatch is a legend entry of one colour.
type swatch struct{ c color.Color }

func (s swatch) Thumbnail(c *draw.Canvas) {
	pts := []vg.Point{{X: c.Min.X, Y: c.Min.Y}, {X: c.Min.X, Y: c.Max.Y}, {X: c.Max.X, Y: c.Max.Y}, {X: c.Max.X, Y: c.Min.Y}}
	c.FillPolygon(s.c, c.ClipPolygonY(pts))
}

// addCDFs draws each non-empty series of xs as its cumulative distribution,
// ours in our colour and the second in stock helm's, named in the legend.
func addCDFs(p *plot.Plot, xs [][]float64, names []string) error {
	for i, x := range xs {
		if len(x) == 0 {
			continue
		}
		l, err := plotter.NewLine(cdf(x))
		if err != nil {
			return err
		}
		l.Color = []color.Color{colOurs, colStock}[i]
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(names[i], l)
	}
	return nil
}
