package main

import (
	"fmt"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/scenario"
	"github.com/amqp091-drainer/amqp091-drainer/internal/chart"
)

// variantColors keeps each variant's colour the same in every chart.
var variantColors = chart.VariantColors

// floorMs keeps zero latencies on a log axis.
const floorMs = 0.001

// drawCharts writes a latency-distribution chart for every charted
// latency of every case, and one chart of all ratios. It returns the
// files by key (chartKey, or "ratios").
func drawCharts(s suite, dir string) (map[string]string, error) {
	files := map[string]string{}
	for _, sr := range s.Scenarios {
		for _, cr := range sr.Cases {
			for _, name := range sr.spec.Report.Charts {
				p, legend, err := latencyChart(sr, cr, name)
				if err != nil {
					return nil, err
				}
				if p == nil {
					continue
				}
				file := filepath.Join(dir, fileName(sr.Name, cr.Case, name)+".png")
				if err := chart.SaveWithLegendBelow(p, legend, 16*vg.Centimeter, 10*vg.Centimeter, file); err != nil {
					return nil, err
				}
				files[chartKey(sr.Name, cr.Case, name)] = file
			}
			file := filepath.Join(dir, fileName(sr.Name, cr.Case)+".png")
			if ok, err := timelineChart(sr, cr, file); err != nil {
				return nil, err
			} else if ok {
				files[chartKey(sr.Name, cr.Case, "timeline")] = file
			}
		}
	}
	p, ok, err := ratioChart(s)
	if err != nil {
		return nil, err
	}
	if ok {
		file := filepath.Join(dir, "ratios.png")
		if err := p.Save(18*vg.Centimeter, vg.Length(2+0.6*float64(ratioCount(s)))*vg.Centimeter+3*vg.Centimeter, file); err != nil {
			return nil, err
		}
		files["ratios"] = file
	}
	return files, nil
}

func chartKey(scen, c, latency string) string { return scen + "|" + c + "|" + latency }

func fileName(parts ...string) string {
	var keep []string
	for _, p := range parts {
		if p == "" {
			continue
		}
		keep = append(keep, strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
				return r
			}
			return '-'
		}, strings.ToLower(p)))
	}
	return strings.Join(keep, "_")
}

// latencyChart plots, per variant, latency against percentile on a log
// scale, from the median over repetitions of each percentile. It returns
// the legend's entries apart, for chart.SaveWithLegendBelow to draw outside the
// data, and a nil plot when no variant has the latency.
//
// Variants often coincide (in stalled-listener every build but the drainer
// waits out the same stall), so each one is drawn wider than the next, in
// the order of cr.Variants: a line drawn over another of the same values
// leaves the one below showing on both sides.
func latencyChart(sr scenarioResult, cr caseResult, name string) (*plot.Plot, []chart.Entry, error) {
	p := plot.New()
	p.Title.Text = strings.Join(strings.Fields(fmt.Sprintf("%s %s", sr.Name, cr.Case)), " ") + ": " + name + " latency"
	p.X.Label.Text = "percentile"
	p.Y.Label.Text = "ms (log)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	var drawn []string
	for _, v := range cr.Variants {
		if len(cr.Points[v][name]) > 0 {
			drawn = append(drawn, v)
		}
	}
	if len(drawn) == 0 {
		return nil, nil, nil
	}
	var labels []string
	var legend []chart.Entry
	for k, v := range drawn {
		pts := cr.Points[v][name]
		xy := make(plotter.XYs, len(pts))
		for i, pt := range pts {
			xy[i].X = float64(i)
			xy[i].Y = max(pt.Millis, floorMs)
			if len(labels) < len(pts) {
				labels = append(labels, fmt.Sprintf("p%g", pt.Percentile))
			}
		}
		line, points, err := plotter.NewLinePoints(xy)
		if err != nil {
			return nil, nil, err
		}
		below := float64(len(drawn) - 1 - k) // variants drawn after this one
		line.Color = variantColors[v]
		line.Width = vg.Points(1.5 + 2*below)
		points.Color = variantColors[v]
		points.Shape = draw.CircleGlyph{}
		points.Radius = vg.Points(2.5 + 1.75*below)
		p.Add(line, points)
		legend = append(legend, chart.Entry{Label: v, Thumbs: []plot.Thumbnailer{line, points}})
	}
	ticks := make([]plot.Tick, len(labels))
	for i, l := range labels {
		ticks[i] = plot.Tick{Value: float64(i), Label: l}
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	// Headroom on the log axis, so that the widest line does not run
	// along the top edge under the title.
	p.Y.Max *= 1.5
	return p, legend, nil
}

func ratioCount(s suite) int {
	n := 0
	for _, sr := range s.Scenarios {
		for _, cr := range sr.Cases {
			for _, r := range sr.spec.Report.Ratios {
				if _, ok := cr.Agg.Ratio(r); ok {
					n++
				}
			}
		}
	}
	return n
}

// ratioChart draws every ratio of the run as a dot on a log axis, with a
// line at 1 (parity).
func ratioChart(s suite) (*plot.Plot, bool, error) {
	type entry struct {
		label string
		v     float64
	}
	var es []entry
	for _, sr := range s.Scenarios {
		for _, cr := range sr.Cases {
			for _, r := range sr.spec.Report.Ratios {
				if v, ok := cr.Agg.Ratio(r); ok && v > 0 {
					label := strings.Join(strings.Fields(sr.Name+" "+cr.Case), " ") + ": " + r.Label
					es = append(es, entry{label, v})
				}
			}
		}
	}
	if len(es) == 0 {
		return nil, false, nil
	}
	p := plot.New()
	p.Title.Text = "ratios between variants (log scale; 1 = parity)"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	xy := make(plotter.XYs, len(es))
	ticks := make([]plot.Tick, len(es))
	lo, hi := 1.0, 1.0
	for i, e := range es {
		y := float64(len(es) - 1 - i)
		xy[i] = plotter.XY{X: e.v, Y: y}
		ticks[i] = plot.Tick{Value: y, Label: fmt.Sprintf("%s = %s×", e.label, scenario.FormatNumber(e.v, ratioDigits(e.v)))}
		lo, hi = min(lo, e.v), max(hi, e.v)
	}
	dots, err := plotter.NewScatter(xy)
	if err != nil {
		return nil, false, err
	}
	dots.Shape = draw.CircleGlyph{}
	dots.Radius = vg.Points(4)
	dots.Color = variantColors["drainer"]
	parity, err := plotter.NewLine(plotter.XYs{{X: 1, Y: -0.5}, {X: 1, Y: float64(len(es)) - 0.5}})
	if err != nil {
		return nil, false, err
	}
	parity.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
	p.Add(parity, dots)
	p.Y.Tick.Marker = plot.ConstantTicks(ticks)
	p.X.Min, p.X.Max = lo/2, hi*2
	p.Y.Min, p.Y.Max = -0.5, float64(len(es))-0.5
	return p, true, nil
}
