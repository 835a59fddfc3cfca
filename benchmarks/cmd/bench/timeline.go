package main

import (
	"fmt"
	"image/color"
	"os"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/internal/hist"
	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/scenario"
)

// Timelines: a case whose runs sample a timeline (the observability
// scenario) gets a chart of one run over time, and a summary of its
// events over the repetitions.

// timelineRuns returns the runs of cr that carry a timeline.
func timelineRuns(cr caseResult) []output {
	var outs []output
	for _, o := range cr.Runs {
		if o.Result != nil && len(o.Result.Timeline) > 0 {
			outs = append(outs, o)
		}
	}
	return outs
}

// chartedRun is the run a timeline chart shows: the one with the median
// pause, and its index among timelineRuns.
func chartedRun(outs []output) (output, int) {
	idx := make([]int, len(outs))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		pa, pb := outs[a].Result.Metrics["pause_ms"], outs[b].Result.Metrics["pause_ms"]
		switch {
		case pa < pb:
			return -1
		case pa > pb:
			return 1
		}
		return 0
	})
	i := idx[len(idx)/2]
	return outs[i], i
}

// Marker colours of the timeline chart.
var (
	warnColor   = color.RGBA{R: 255, G: 127, B: 14, A: 255}
	pauseColor  = color.RGBA{R: 214, G: 39, B: 40, A: 255}
	resumeColor = color.RGBA{R: 44, G: 160, B: 44, A: 255}
	usedColor   = color.RGBA{R: 31, G: 119, B: 180, A: 255}
	depthColor  = color.RGBA{R: 148, G: 103, B: 189, A: 255}
	limitColor  = color.RGBA{R: 120, G: 120, B: 120, A: 255}
)

// timelineChart draws the charted run of cr as two panels, budget used
// over listener depth, with the Logger's events as vertical lines and the
// legend in a strip of its own below them, and writes it to file.
func timelineChart(sr scenarioResult, cr caseResult, file string) (bool, error) {
	outs := timelineRuns(cr)
	if len(outs) == 0 {
		return false, nil
	}
	o, i := chartedRun(outs)
	res := o.Result
	const mib = 1 << 20
	limit := 0.0
	used, depth := make(plotter.XYs, len(res.Timeline)), make(plotter.XYs, len(res.Timeline))
	maxUsed, maxDepth := 0.0, 0.0
	for j, p := range res.Timeline {
		used[j] = plotter.XY{X: p.T, Y: float64(p.Used) / mib}
		depth[j] = plotter.XY{X: p.T, Y: float64(p.Depth)}
		maxUsed, maxDepth = max(maxUsed, used[j].Y), max(maxDepth, depth[j].Y)
	}
	if v, ok := res.Metrics["budget_mib"]; ok {
		limit = v
	}
	tEnd := res.Timeline[len(res.Timeline)-1].T

	top, bottom := plot.New(), plot.New()
	top.Title.Text = fmt.Sprintf("%s %s: drainer, repetition %d of %d (median pause)", sr.Name, cr.Case, i+1, len(outs))
	top.Y.Label.Text = "budget used (MiB)"
	bottom.Y.Label.Text = "listener depth (notifications)"
	bottom.X.Label.Text = "time since the first publish (s)"
	top.Y.Max = max(maxUsed, limit) * 1.1
	bottom.Y.Max = max(maxDepth, 1) * 1.1
	for _, p := range []*plot.Plot{top, bottom} {
		p.X.Min, p.X.Max = 0, tEnd
		p.Y.Min = 0
		p.Add(plotter.NewGrid())
	}

	series := plot.NewLegend()
	markers := plot.NewLegend()
	addLine := func(p *plot.Plot, xy plotter.XYs, c color.Color, dashed bool, width float64) (*plotter.Line, error) {
		l, err := plotter.NewLine(xy)
		if err != nil {
			return nil, err
		}
		l.Color, l.Width = c, vg.Points(width)
		if dashed {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(l)
		return l, nil
	}
	l, err := addLine(top, used, usedColor, false, 1.5)
	if err != nil {
		return false, err
	}
	series.Add("budget used (Stats().Budget.Used)", l)
	if l, err = addLine(bottom, depth, depthColor, false, 1.5); err != nil {
		return false, err
	}
	series.Add("NotifyPublish depth (Stats().Listeners[].Queued)", l)
	if limit > 0 {
		if l, err = addLine(top, plotter.XYs{{X: 0, Y: limit}, {X: tEnd, Y: limit}}, limitColor, true, 1); err != nil {
			return false, err
		}
		series.Add(fmt.Sprintf("budget (%s MiB)", scenario.FormatNumber(limit, 0)), l)
	}
	for _, m := range []struct {
		metric, label string
		c             color.Color
	}{
		{"depth_warning_at_s", "Logger: depth warning", warnColor},
		{"pause_at_s", "Logger: read budget full (pause)", pauseColor},
		{"resume_at_s", "Logger: reads the socket again (resume)", resumeColor},
	} {
		t, ok := res.Metrics[m.metric]
		if !ok {
			continue
		}
		var first *plotter.Line
		for _, p := range []*plot.Plot{top, bottom} {
			l, err := addLine(p, plotter.XYs{{X: t, Y: 0}, {X: t, Y: p.Y.Max}}, m.c, true, 1.5)
			if err != nil {
				return false, err
			}
			if first == nil {
				first = l
			}
		}
		markers.Add(fmt.Sprintf("%s at %.3f s", m.label, t), first)
	}

	w, h := 18*vg.Centimeter, 16*vg.Centimeter
	legendH := 1.9 * vg.Centimeter
	img := vgimg.New(w, h)
	dc := draw.New(img)
	panels := draw.Crop(dc, 0, 0, legendH, 0)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadTop: vg.Points(4), PadBottom: vg.Points(4),
		PadLeft: vg.Points(4), PadRight: vg.Points(8), PadY: vg.Points(8)}
	canvases := plot.Align([][]*plot.Plot{{top}, {bottom}}, tiles, panels)
	top.Draw(canvases[0][0])
	bottom.Draw(canvases[1][0])
	strip := draw.Crop(dc, vg.Centimeter, 0, 0, -(h - legendH))
	for k, lg := range []*plot.Legend{&series, &markers} {
		lg.Top, lg.Left = true, true
		lg.TextStyle.Font.Size = vg.Points(9)
		lg.Padding = vg.Points(2)
		half := (strip.Max.X - strip.Min.X) / 2
		c := strip
		c.Min.X += vg.Length(k) * half
		c.Max.X = c.Min.X + half
		lg.Draw(c)
	}
	f, err := os.Create(file)
	if err != nil {
		return false, err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return false, err
	}
	return true, f.Close()
}

// timelineSummary is the text the report gives a timeline case: its
// events' percentiles over the repetitions, the peaks, and the log lines
// of the charted run, quoted as slog.NewTextHandler printed them.
func timelineSummary(sr scenarioResult, cr caseResult) string {
	outs := timelineRuns(cr)
	if len(outs) == 0 {
		return ""
	}
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	var others []string
	for _, v := range scenario.Variants {
		// The references (the drain's go-floor and c-client) are not
		// amqp091-go: they have no mode to say n/a of; an opt-in variant
		// runs only where it is asked for.
		if !v.Reference && !v.OptIn && !slices.Contains(cr.Variants, v.Name) {
			others = append(others, v.Name)
		}
	}
	w("Over %d repetition(s) of the drainer", len(outs))
	if len(others) > 0 {
		w(" (%s: n/a, no read budget)", strings.Join(others, ", "))
	}
	w(":\n\n| figure | P50 | P95 | P99 | max |\n|---|---|---|---|---|\n")
	for _, f := range []struct{ label, metric string }{
		{"depth warning → pause, ms", "warn_to_pause_ms"},
		{"pause length, ms", "pause_ms"},
	} {
		r := hist.New()
		for _, o := range outs {
			if v, ok := o.Result.Metrics[f.metric]; ok {
				r.Record(time.Duration(v * float64(time.Millisecond)))
			}
		}
		s := r.Summary()
		if s.N == 0 {
			w("| %s | — | — | — | — |\n", f.label)
			continue
		}
		w("| %s | %s | %s | %s | %s |\n", f.label, scenario.FormatNumber(s.P50, 1), scenario.FormatNumber(s.P95, 1),
			scenario.FormatNumber(s.P99, 1), scenario.FormatNumber(s.Max, 1))
	}
	peaks := scenario.Aggregate(func() []map[string]float64 {
		var ms []map[string]float64
		for _, o := range outs {
			ms = append(ms, o.Result.Metrics)
		}
		return ms
	}())
	used, depth := peaks["peak_used_mib"], peaks["peak_depth"]
	w("\nPeak budget used (Stats().Budget.Used, budget %s MiB): median %s MiB, max %s MiB. "+
		"Peak NotifyPublish depth (Stats().Listeners[].Queued): median %s, max %s confirmations.\n",
		scenario.FormatNumber(peaks["budget_mib"].Max, 0),
		scenario.FormatNumber(used.Median, 3), scenario.FormatNumber(used.Max, 3),
		scenario.FormatNumber(depth.Median, 0), scenario.FormatNumber(depth.Max, 0))
	o, i := chartedRun(outs)
	w("\nWhat the Logger printed in repetition %d, as slog.NewTextHandler formats it:\n\n```text\n", i+1)
	for _, name := range []string{"depth_warning", "pause", "resume"} {
		if l, ok := o.Result.Lines[name]; ok {
			w("%s\n", l)
		}
	}
	w("```\n")
	return b.String()
}
