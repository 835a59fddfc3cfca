// Package chart holds what the benchmark report's charts and the chaos
// report's timelines share: each variant's colour, and a PNG writer that
// puts the legend in a strip of its own under the plot.
package chart

import (
	"image/color"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// VariantColors keeps each variant's (and read mode's) colour the same in
// every chart.
var VariantColors = map[string]color.Color{
	"pristine":         color.RGBA{R: 120, G: 120, B: 120, A: 255},
	"upstream":         color.RGBA{R: 31, G: 119, B: 180, A: 255},
	"legacy":           color.RGBA{R: 214, G: 39, B: 40, A: 255},
	"legacy-autodrain": color.RGBA{R: 214, G: 39, B: 40, A: 255},
	"drainer":          color.RGBA{R: 44, G: 160, B: 44, A: 255},
}

// Entry is one line of a chart's legend.
type Entry struct {
	Label  string
	Thumbs []plot.Thumbnailer
}

// SaveWithLegendBelow writes p as a w×h PNG with its legend in a row of
// its own under the plot, where it cannot cover any data.
func SaveWithLegendBelow(p *plot.Plot, legend []Entry, w, h vg.Length, file string) error {
	const colW = 3 * vg.Centimeter
	stripH := 0.8 * vg.Centimeter
	img := vgimg.New(w, h)
	dc := draw.New(img)
	p.Draw(draw.Crop(dc, 0, 0, stripH, 0))
	strip := draw.Crop(dc, 0, 0, 0, -(h - stripH))
	left := strip.Min.X + (strip.Max.X-strip.Min.X-vg.Length(len(legend))*colW)/2
	for i, e := range legend {
		lg := plot.NewLegend()
		lg.Top, lg.Left = true, true
		lg.Add(e.Label, e.Thumbs...)
		c := strip
		c.Min.X = left + vg.Length(i)*colW
		c.Max.X = c.Min.X + colW
		lg.Draw(c)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
