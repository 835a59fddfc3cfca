package nemesis

import (
	"fmt"
	"image/color"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	vgdraw "gonum.org/v1/plot/vg/draw"

	"github.com/amqp091-drainer/amqp091-drainer/internal/chart"
)

// kindColors tell the fault kinds apart in a timeline's bands.
var kindColors = map[Kind]color.RGBA{
	Kill:         {R: 214, G: 39, B: 40},
	StopApp:      {R: 255, G: 127, B: 14},
	Partition:    {R: 148, G: 103, B: 189},
	Bridge:       {R: 140, G: 86, B: 75},
	ClientLink:   {R: 227, G: 119, B: 194},
	FreezeNode:   {R: 23, G: 190, B: 207},
	FreezeClient: {R: 188, G: 189, B: 34},
}

// perSecond counts times into one-second bins from start, over n seconds.
func perSecond(times []time.Time, start time.Time, n int) plotter.XYs {
	xy := make(plotter.XYs, n)
	for i := range xy {
		xy[i].X = float64(i) + 0.5
	}
	for _, t := range times {
		if i := int(t.Sub(start) / time.Second); i >= 0 && i < n {
			xy[i].Y++
		}
	}
	return xy
}

// Timeline draws one mode's run to file (PNG): the faults as they ran, as
// translucent bands, and confirms and deliveries per second as lines.
func Timeline(mr ModeResult, ran Schedule, file string) error {
	var confirms, deliveries []time.Time
	for _, m := range mr.History.Messages {
		if m.Confirmed {
			confirms = append(confirms, m.ConfirmedAt)
		}
		deliveries = append(deliveries, m.Deliveries...)
	}
	n := int(ran.Options.Duration/time.Second) + 1
	for _, a := range ran.Actions {
		n = max(n, int(a.End()/time.Second)+1)
	}
	cps, dps := perSecond(confirms, mr.History.Start, n), perSecond(deliveries, mr.History.Start, n)
	top := 1.0
	for i := range cps {
		top = max(top, cps[i].Y, dps[i].Y)
	}
	top *= 1.15
	p := plot.New()
	p.Title.Text = fmt.Sprintf("nemesis seed %d, %s: %d confirmed, %d lost", ran.Seed, mr.Mode,
		mr.Report.Confirmed, mr.Report.Lost)
	p.X.Label.Text = "time since the schedule's start (s)"
	p.Y.Label.Text = "per second"
	p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = 0, float64(n), 0, top
	p.Add(plotter.NewGrid())
	var legend []chart.Entry
	seen := map[Kind]bool{}
	for i, a := range ran.Actions {
		band, err := bandOf(a, i, top)
		if err != nil {
			return err
		}
		p.Add(band)
		if !seen[a.Kind] {
			seen[a.Kind] = true
			legend = append(legend, chart.Entry{Label: string(a.Kind), Thumbs: []plot.Thumbnailer{band}})
		}
	}
	for _, s := range []struct {
		label string
		xy    plotter.XYs
		c     color.Color
	}{{"confirms/s", cps, chart.VariantColors[mr.Mode.String()]}, {"deliveries/s", dps, color.Black}} {
		l, err := plotter.NewLine(s.xy)
		if err != nil {
			return err
		}
		l.Color, l.Width = s.c, vg.Points(1)
		if s.label == "deliveries/s" {
			l.Dashes = []vg.Length{vg.Points(3), vg.Points(2)}
		}
		p.Add(l)
		legend = append(legend, chart.Entry{Label: s.label, Thumbs: []plot.Thumbnailer{l}})
	}
	return chart.SaveWithLegendBelow(p, legend, 24*vg.Centimeter, 10*vg.Centimeter, file)
}

// bandOf is a's band: its time span, the plot's height, its kind's
// colour, a little lower for each later fault so that overlaps show.
func bandOf(a Action, i int, top float64) (*plotter.Polygon, error) {
	from, to := a.Start.Seconds(), a.End().Seconds()
	h := top * (1 - 0.25*float64(i%4)/4)
	band, err := plotter.NewPolygon(plotter.XYs{{X: from, Y: 0}, {X: to, Y: 0}, {X: to, Y: h}, {X: from, Y: h}})
	if err != nil {
		return nil, err
	}
	c := kindColors[a.Kind]
	c.A = 70
	band.Color, band.LineStyle = premultiplied(c), vgdraw.LineStyle{}
	return band, nil
}

// premultiplied is c with its colour scaled by its alpha, as color.RGBA
// expects.
func premultiplied(c color.RGBA) color.RGBA {
	f := func(v uint8) uint8 { return uint8(uint16(v) * uint16(c.A) / 255) }
	return color.RGBA{R: f(c.R), G: f(c.G), B: f(c.B), A: c.A}
}

// WriteReport writes a run's report (Markdown): the schedule as drawn and
// as it ran, each mode's verdict, and each mode's timeline (charts: mode
// → PNG path, relative to the report).
func WriteReport(w io.Writer, res RunResult, charts map[string]string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "## Seed %d\n\nThe schedule as drawn:\n\n```\n%s```\n\nAs it ran:\n\n", res.Planned.Seed, res.Planned)
	for _, f := range res.Faults {
		fmt.Fprintf(&b, "- %s\n", f)
	}
	b.WriteString("\n| mode | published | confirmed | lost | duplicates | unconfirmed but delivered | stale | failed | leaked goroutines | peak RSS |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, m := range res.Modes {
		r := m.Report
		fmt.Fprintf(&b, "| %s | %d | %d | **%d** | %d | %d | %d | %d | %d | %.0f MiB |\n", m.Mode, r.Published,
			r.Confirmed, r.Lost, r.Duplicates, r.UnconfirmedDelivered, r.Stale, sum(r.Failed), r.Leaked,
			float64(r.PeakRSSKiB)/1024)
	}
	b.WriteString("\nThe longest gap between a workload's confirms that overlaps faults of one kind only " +
		"(overlap: of several kinds):\n\n| mode |")
	kinds := gapKinds(res)
	for _, k := range kinds {
		fmt.Fprintf(&b, " %s |", k)
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(kinds)) + "\n")
	for _, m := range res.Modes {
		fmt.Fprintf(&b, "| %s |", m.Mode)
		for _, k := range kinds {
			if g, ok := m.Report.LongestGap[k]; ok {
				fmt.Fprintf(&b, " %.2f s |", g.Seconds())
			} else {
				b.WriteString(" — |")
			}
		}
		b.WriteString("\n")
	}
	for _, m := range res.Modes {
		fmt.Fprintf(&b, "\n### %s\n\n", m.Mode)
		if c, ok := charts[m.Mode.String()]; ok {
			fmt.Fprintf(&b, "![%s](%s)\n\n", m.Mode, c)
		}
		if m.Stuck != "" {
			fmt.Fprintf(&b, "- **stuck**: %s\n", m.Stuck)
		}
		for _, reason := range slices.Sorted(maps.Keys(m.Report.Failed)) {
			fmt.Fprintf(&b, "- failed ×%d: %s\n", m.Report.Failed[reason], reason)
		}
		for _, story := range m.Report.LostHistories {
			fmt.Fprintf(&b, "- %s\n", story)
		}
		fmt.Fprintf(&b, "\nClients at their end:\n\n```\n%s\n```\n", m.Stats)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// gapKinds are the LongestGap keys of any mode, in Kinds' order, Overlap
// last.
func gapKinds(res RunResult) []Kind {
	var ks []Kind
	for _, k := range append(slices.Clone(Kinds), Overlap) {
		for _, m := range res.Modes {
			if _, ok := m.Report.LongestGap[k]; ok {
				ks = append(ks, k)
				break
			}
		}
	}
	return ks
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
