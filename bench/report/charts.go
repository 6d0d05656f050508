package report

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Chart file names written by Charts.
const (
	ChartTTFT     = "ttft_cdf.png"
	ChartHitRatio = "hit_ratio.png"
	ChartLoad     = "worker_load.png"
	ChartLoadTime = "load_over_time.png"
)

// palette is Tableau 10 with grey moved forward, so the six policies of a
// full comparison get six clearly different colours.
var palette = []color.Color{
	color.RGBA{0x1f, 0x77, 0xb4, 0xff}, // blue
	color.RGBA{0xff, 0x7f, 0x0e, 0xff}, // orange
	color.RGBA{0x2c, 0xa0, 0x2c, 0xff}, // green
	color.RGBA{0xd6, 0x27, 0x28, 0xff}, // red
	color.RGBA{0x94, 0x67, 0xbd, 0xff}, // purple
	color.RGBA{0x40, 0x40, 0x40, 0xff}, // dark grey
	color.RGBA{0xe3, 0x77, 0xc2, 0xff}, // pink
	color.RGBA{0xbc, 0xbd, 0x22, 0xff}, // olive
	color.RGBA{0x17, 0xbe, 0xcf, 0xff}, // cyan
	color.RGBA{0x8c, 0x56, 0x4b, 0xff}, // brown
}

func colorOf(i int) color.Color { return palette[i%len(palette)] }

// Charts draws the PNG charts into dir and returns their paths.
func (r *Report) Charts(dir string) ([]string, error) {
	var out []string
	for _, c := range []struct {
		name string
		draw func() (*plot.Plot, error)
		w, h vg.Length
	}{
		{ChartTTFT, r.ttftChart, 8 * vg.Inch, 5 * vg.Inch},
		{ChartHitRatio, r.hitChart, 8 * vg.Inch, 5 * vg.Inch},
		{ChartLoad, r.loadChart, 10 * vg.Inch, 5 * vg.Inch},
		{ChartLoadTime, r.loadTimeChart, 10 * vg.Inch, 5 * vg.Inch},
	} {
		p, err := c.draw()
		if err != nil {
			return out, fmt.Errorf("%w: chart %s: %w", ErrReport, c.name, err)
		}
		path := filepath.Join(dir, c.name)
		if err := p.Save(c.w, c.h, path); err != nil {
			return out, fmt.Errorf("%w: save %s: %w", ErrReport, path, err)
		}
		out = append(out, path)
	}
	return out, nil
}

func (r *Report) ttftChart() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Time to first token, CDF per policy"
	p.X.Label.Text = "TTFT (ms, log scale, workload time)"
	p.Y.Label.Text = "fraction of requests"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = 0, 1
	p.Legend.Top = false
	p.Legend.Left = false
	p.Add(plotter.NewGrid())
	any := false
	for i, s := range r.Policies {
		if len(s.TTFTCDF) < 2 {
			continue
		}
		pts := make(plotter.XYs, len(s.TTFTCDF))
		for j, v := range s.TTFTCDF {
			pts[j].X = math.Max(v, 0.1) // log axis
			pts[j].Y = float64(j) / float64(len(s.TTFTCDF)-1)
		}
		if err := addPolicyLine(p, pts, i, s.Label(r.multiPath())); err != nil {
			return nil, err
		}
		any = true
	}
	if !any {
		// An empty log axis cannot be drawn; show an empty linear one.
		p.X.Scale = plot.LinearScale{}
		p.X.Tick.Marker = plot.DefaultTicks{}
	}
	return p, nil
}

func (r *Report) hitChart() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Prefix-cache hit ratio per policy"
	p.Y.Label.Text = "hit ratio (%)"
	names := make([]string, len(r.Policies))
	vals := make(plotter.Values, len(r.Policies))
	for i, s := range r.Policies {
		names[i] = s.Label(r.multiPath())
		vals[i] = 100 * s.HitRatio
	}
	p.Add(plotter.NewGrid())
	if len(vals) > 0 {
		bars, err := plotter.NewBarChart(vals, vg.Points(36))
		if err != nil {
			return nil, err
		}
		bars.Color = colorOf(0)
		bars.LineStyle.Width = 0
		p.Add(bars)
		labels, err := plotter.NewLabels(plotter.XYLabels{XYs: barTops(vals), Labels: fmtVals(vals)})
		if err == nil {
			p.Add(labels)
		}
		p.NominalX(names...)
	}
	ub := 100 * r.Workload.UpperBound.Ratio
	if ub > 0 {
		n := math.Max(float64(len(vals)), 1)
		line, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: ub}, {X: n - 0.5, Y: ub}})
		if err != nil {
			return nil, err
		}
		line.Color = color.RGBA{R: 200, A: 255}
		line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(line)
		p.Legend.Add("infinite-cache upper bound "+strconv.FormatFloat(ub, 'f', 1, 64)+" %", line)
		p.Legend.Top = true
	}
	p.Y.Min = 0
	p.Y.Max = math.Max(ub, maxOf(vals)) * 1.15
	if p.Y.Max == 0 {
		p.Y.Max = 1
	}
	return p, nil
}

func barTops(v plotter.Values) plotter.XYs {
	xy := make(plotter.XYs, len(v))
	for i, y := range v {
		xy[i] = plotter.XY{X: float64(i) - 0.25, Y: y + 0.5}
	}
	return xy
}

func fmtVals(v plotter.Values) []string {
	out := make([]string, len(v))
	for i, y := range v {
		out[i] = strconv.FormatFloat(y, 'f', 1, 64)
	}
	return out
}

func maxOf(v plotter.Values) float64 {
	m := 0.0
	for _, x := range v {
		m = math.Max(m, x)
	}
	return m
}

func (r *Report) loadChart() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Requests served per worker, per policy"
	p.Y.Label.Text = "requests"
	p.Add(plotter.NewGrid())
	var workers []string
	for _, s := range r.Policies {
		if len(s.Workers) > len(workers) {
			workers = workers[:0]
			for _, w := range s.Workers {
				workers = append(workers, w.Worker)
			}
		}
	}
	n := len(r.Policies)
	if n == 0 || len(workers) == 0 {
		return p, nil
	}
	top := 0.0
	width := vg.Points(math.Max(2, math.Min(14, 600/float64(n*len(workers)))))
	for i, s := range r.Policies {
		vals := make(plotter.Values, len(workers))
		for j, name := range workers {
			for _, w := range s.Workers {
				if w.Worker == name {
					vals[j] = float64(w.Requests)
				}
			}
		}
		top = math.Max(top, maxOf(vals))
		bars, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return nil, err
		}
		bars.Color = colorOf(i)
		bars.LineStyle.Width = 0
		bars.Offset = vg.Length(float64(i)-float64(n-1)/2) * width
		p.Add(bars)
		p.Legend.Add(s.Label(r.multiPath()), bars)
	}
	p.Legend.Top = true
	p.Y.Min = 0
	p.Y.Max = math.Max(top, 1) * (1.1 + 0.06*float64(n)) // room for the legend
	p.NominalX(workers...)
	return p, nil
}

// loadTimeChart draws, per policy, the busiest worker's in-flight requests
// over the fleet's mean through the run (Summary.LoadOverTime): hot spots
// show as peaks well above 1.
func (r *Report) loadTimeChart() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Load spread over time: busiest worker's in-flight requests / mean"
	p.X.Label.Text = "fraction of the run (makespan)"
	p.Y.Label.Text = "max / mean in-flight"
	p.Add(plotter.NewGrid())
	top := 1.0
	for i, s := range r.Policies {
		n := len(s.LoadOverTime)
		if n < 2 {
			continue
		}
		pts := make(plotter.XYs, n)
		for j, v := range s.LoadOverTime {
			pts[j] = plotter.XY{X: float64(j) / float64(n-1), Y: v}
			top = math.Max(top, v)
		}
		if err := addPolicyLine(p, pts, i, s.Label(r.multiPath())); err != nil {
			return nil, err
		}
	}
	p.Legend.Top = true
	p.Y.Min, p.Y.Max = 0, top*1.25
	p.X.Min, p.X.Max = 0, 1
	return p, nil
}

// addPolicyLine draws row i's line in its colour (dashed past the palette)
// with its legend entry.
func addPolicyLine(p *plot.Plot, pts plotter.XYs, i int, label string) error {
	l, err := plotter.NewLine(pts)
	if err != nil {
		return err
	}
	l.Color = colorOf(i)
	l.Width = vg.Points(1.5)
	l.Dashes = plotutil.Dashes(i / len(palette))
	p.Add(l)
	p.Legend.Add(label, l)
	return nil
}
