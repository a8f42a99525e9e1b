package plot

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strconv"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/crdipc/crdipc/internal/bench"
)

// Files are the figures Draw makes, in order.
var Files = []string{"up.png", "latency.png", "throughput.png", "scale-memory.png", "scale-latency.png", "volume.png"}

// Result is what Draw did with one figure: wrote it to Path, or skipped it for Skipped.
type Result struct {
	File    string
	Path    string
	Skipped string
}

// figure is one PNG: panels stacked top to bottom, each a plot.
type figure struct {
	panels []*gplot.Plot
}

// Size of a figure: a panel is panelHeight high; dpi makes the PNG large enough to stay
// sharp when a page scales it down.
const (
	width       = 8 * vg.Inch
	panelHeight = 3.6 * vg.Inch
	dpi         = 120
)

// Draw writes into dir each figure whose data a holds (see Files) and says of the others
// why not. A figure is written whole or not at all: drawn in memory, then written to a
// temporary file that is renamed over its name.
func Draw(a *bench.All, dir string) ([]Result, error) {
	draws := map[string]func(*bench.All) (*figure, string, error){
		"up.png":            upStarts,
		"latency.png":       latency,
		"throughput.png":    throughput,
		"scale-memory.png":  scaleMemory,
		"scale-latency.png": scaleLatency,
		"volume.png":        volume,
	}
	var results []Result
	for _, name := range Files {
		f, why, err := draws[name](a)
		if err != nil {
			return results, fmt.Errorf("%s: %w", name, err)
		}
		if f == nil {
			results = append(results, Result{File: name, Skipped: why})
			continue
		}
		f.panels[0].Title.Text += "\n" + caption(a)
		path := filepath.Join(dir, name)
		if err := f.write(path); err != nil {
			return results, fmt.Errorf("%s: %w", name, err)
		}
		results = append(results, Result{File: name, Path: path})
	}
	return results, nil
}

// caption says when and where the figures were measured, under the first panel's title.
func caption(a *bench.All) string {
	m := a.Machine
	s := fmt.Sprintf("%s, %d CPUs, %.0f GiB, Linux %s, %s", a.Date.Format("2006-01-02"), m.CPUs, float64(m.MemoryBytes)/(1<<30), m.Kernel, m.GoVersion)
	if a.Target != "" {
		s += ", " + a.Target
	}
	if a.Quick {
		s += "\nquick run: smoke-test sizes, not figures for the record"
	}
	return s
}

func (f *figure) write(path string) (err error) {
	h := panelHeight * vg.Length(len(f.panels))
	img := vgimg.NewWith(vgimg.UseWH(width, h), vgimg.UseDPI(dpi))
	dc := draw.New(img)
	rows := make([][]*gplot.Plot, len(f.panels))
	for i, p := range f.panels {
		rows[i] = []*gplot.Plot{p}
	}
	tiles := draw.Tiles{Rows: len(rows), Cols: 1, PadX: vg.Millimeter, PadY: 4 * vg.Millimeter,
		PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 4 * vg.Millimeter}
	if err := drawSafely(func() {
		canvases := gplot.Align(rows, tiles, dc)
		for i, p := range f.panels {
			p.Draw(canvases[i][0])
		}
	}); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(tmp); err != nil {
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// drawSafely turns a panic of the plotting library (it panics on data it cannot scale,
// such as a non-positive value on a log axis) into an error.
func drawSafely(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("drawing: %v", r)
		}
	}()
	f()
	return nil
}

// newPanel is a plot with a title and labelled axes, its legend top left.
func newPanel(title, x, y string) *gplot.Plot {
	p := gplot.New()
	p.Title.Text = title
	p.Title.Padding = 2 * vg.Millimeter
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.XOffs, p.Legend.YOffs = 2*vg.Millimeter, -vg.Millimeter
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.Add(plotter.NewGrid())
	p.X.Tick.Marker, p.Y.Tick.Marker = plainTicks, plainTicks
	return p
}

// plainTicks are gonum's default ticks labelled without trailing zeros (250, not 250.00).
var plainTicks = gplot.TickerFunc(func(lo, hi float64) []gplot.Tick {
	ticks := gplot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = number(ticks[i].Value)
		}
	}
	return ticks
})

// newBarPanel is newPanel for bars over n nominal x positions, without vertical grid
// lines (they would run through the bars).
func newBarPanel(title, y string, names ...string) *gplot.Plot {
	p := gplot.New()
	p.Title.Text = title
	p.Title.Padding = 2 * vg.Millimeter
	p.Y.Label.Text = y
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.XOffs, p.Legend.YOffs = 2*vg.Millimeter, -vg.Millimeter
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	g := plotter.NewGrid()
	g.Vertical.Color = nil
	p.Add(g)
	p.NominalX(names...)
	p.X.Min, p.X.Max = -0.5, float64(len(names))-0.5
	p.Y.Min = 0
	p.Y.Tick.Marker = plainTicks
	return p
}

// series adds a line with points, in style i, to p and its legend.
func series(p *gplot.Plot, name string, i int, xys plotter.XYs) error {
	if len(xys) == 0 {
		return nil
	}
	l, s, err := plotter.NewLinePoints(xys)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	l.Color, s.Color = plotutil.Color(i), plotutil.Color(i)
	l.Width = vg.Points(1.5)
	s.Shape, s.Radius = plotutil.Shape(i), vg.Points(2.5)
	p.Add(l, s)
	p.Legend.Add(name, l, s)
	return nil
}

// goalLine adds a dashed horizontal line at y across [x0, x1] to p and its legend.
func goalLine(p *gplot.Plot, name string, y, x0, x1 float64, c color.Color) error {
	l, err := plotter.NewLine(plotter.XYs{{X: x0, Y: y}, {X: x1, Y: y}})
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	l.Color = c
	l.Width = vg.Points(1.5)
	l.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
	p.Add(l)
	p.Legend.Add(name, l)
	return nil
}

// goalColor draws goals: red, apart from every series colour.
var goalColor = color.RGBA{R: 200, G: 30, B: 30, A: 255}

// neutralColor draws references that are not goals, such as "= local file"; ceilingColor
// fills the bars of ceilings.
var (
	neutralColor = color.Gray{Y: 110}
	ceilingColor = color.Gray{Y: 185}
)

// bars adds a group of bars, the n-th of count, to p: one per value, at x = 0, 1, …, each
// labelled above the higher of its value and labelAbove's (a goal mark there), if any.
func bars(p *gplot.Plot, name string, n, count int, c color.Color, values plotter.Values, labels []string, labelAbove ...float64) error {
	const barWidth = 18
	b, err := plotter.NewBarChart(values, vg.Points(barWidth))
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	b.Color = c
	b.LineStyle.Width = 0
	b.Offset = vg.Points(barWidth * (float64(n) - float64(count-1)/2))
	p.Add(b)
	p.Legend.Add(name, b)
	if labels == nil {
		return nil
	}
	xys := make(plotter.XYs, len(values))
	for i, v := range values {
		xys[i] = plotter.XY{X: float64(i), Y: v}
		if i < len(labelAbove) {
			xys[i].Y = max(v, labelAbove[i])
		}
	}
	l, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: labels})
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	for i := range l.TextStyle {
		l.TextStyle[i].Font.Size = vg.Points(8)
		l.TextStyle[i].XAlign = draw.XCenter
	}
	l.Offset = vg.Point{X: b.Offset, Y: vg.Points(4)}
	p.Add(l)
	return nil
}

// logAxis makes a a log axis over [lo, hi] with a margin, ticks labelled 1, 2, 5 × 10ⁿ.
func logAxis(a *gplot.Axis, lo, hi float64) error {
	if !(lo > 0) || !(hi >= lo) || math.IsInf(hi, 0) {
		return fmt.Errorf("log axis over [%v, %v]: want positive bounds", lo, hi)
	}
	a.Scale = gplot.LogScale{}
	a.Min, a.Max = lo/1.4, hi*1.4
	a.Tick.Marker = gplot.TickerFunc(func(lo, hi float64) []gplot.Tick {
		var ticks []gplot.Tick
		for e := math.Floor(math.Log10(lo)); math.Pow(10, e) <= hi; e++ {
			for _, m := range []float64{1, 2, 5} {
				if v := m * math.Pow(10, e); v >= lo && v <= hi {
					ticks = append(ticks, gplot.Tick{Value: v, Label: number(v)})
				}
			}
		}
		return ticks
	})
	return nil
}

// number formats v shortly: 0.05, 2, 150, 20k, 1.5M.
func number(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', -1, 64) + "M"
	case a >= 1e4:
		return strconv.FormatFloat(v/1e3, 'f', -1, 64) + "k"
	case a >= 100 || a == 0:
		return strconv.FormatFloat(v, 'f', 0, 64)
	default:
		return strconv.FormatFloat(v, 'g', 2, 64)
	}
}

// count formats a number of objects: 300, 1k, 10k, 100k.
func count(n int) string {
	if n >= 1000 && n%1000 == 0 {
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}

// minMax is the least and greatest of vs, skipping non-positive values (they have no
// place on a log axis).
func minMax(vs ...float64) (lo, hi float64, ok bool) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, v := range vs {
		if v > 0 && !math.IsInf(v, 0) && !math.IsNaN(v) {
			lo, hi, ok = min(lo, v), max(hi, v), true
		}
	}
	return lo, hi, ok
}

// goalGlyph marks a goal: a thick horizontal stroke, the level to reach, as wide as the
// glyph's diameter.
type goalGlyph struct{}

func (goalGlyph) DrawGlyph(c *draw.Canvas, sty draw.GlyphStyle, pt vg.Point) {
	c.SetLineStyle(draw.LineStyle{Color: sty.Color, Width: vg.Points(3)})
	var p vg.Path
	p.Move(vg.Point{X: pt.X - sty.Radius, Y: pt.Y})
	p.Line(vg.Point{X: pt.X + sty.Radius, Y: pt.Y})
	c.Stroke(p)
}
