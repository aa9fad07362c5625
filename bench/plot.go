package main

import (
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
)

// writePlot draws throughput against callers (log2 x axis, linear y) for
// each implementation of the uncontended scenario, as a self-contained SVG.
func writePlot(path, title string, results []Result) error {
	series := map[string][]Result{}
	var maxY float64
	var xs []int
	seenX := map[int]bool{}
	for _, r := range results {
		if r.Scenario != "uncontended" {
			continue
		}
		series[r.Impl] = append(series[r.Impl], r)
		maxY = math.Max(maxY, r.CyclesPerSec)
		if !seenX[r.Callers] {
			seenX[r.Callers] = true
			xs = append(xs, r.Callers)
		}
	}
	if len(series) == 0 {
		return nil
	}
	sort.Ints(xs)
	const w, h, left, right, top, bottom = 760.0, 440.0, 80.0, 190.0, 40.0, 50.0
	pw, ph := w-left-right, h-top-bottom
	maxY = niceCeil(maxY)
	xpos := func(c int) float64 {
		if len(xs) == 1 {
			return left + pw/2
		}
		lo, hi := math.Log2(float64(xs[0])), math.Log2(float64(xs[len(xs)-1]))
		return left + (math.Log2(float64(c))-lo)/(hi-lo)*pw
	}
	ypos := func(v float64) float64 { return top + ph - v/maxY*ph }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", left, title)
	for i := 0; i <= 5; i++ {
		v := maxY * float64(i) / 5
		y := ypos(v)
		fmt.Fprintf(&b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, left+pw, y)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y+4, human(v))
	}
	for _, c := range xs {
		x := xpos(c)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#ddd"/>`+"\n", x, top, x, top+ph)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%d</text>`+"\n", x, top+ph+18, c)
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">concurrent callers</text>`+"\n", left+pw/2, h-8)
	fmt.Fprintf(&b, `<text x="16" y="%.0f" transform="rotate(-90 16 %.0f)" text-anchor="middle">acquire+release cycles/s</text>`+"\n", top+ph/2, top+ph/2)
	colors := []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"}
	names := make([]string, 0, len(series))
	for k := range series {
		names = append(names, k)
	}
	sort.Strings(names)
	for i, name := range names {
		pts := series[name]
		sort.Slice(pts, func(a, b int) bool { return pts[a].Callers < pts[b].Callers })
		col := colors[i%len(colors)]
		var path []string
		for _, p := range pts {
			path = append(path, fmt.Sprintf("%.1f,%.1f", xpos(p.Callers), ypos(p.CyclesPerSec)))
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", xpos(p.Callers), ypos(p.CyclesPerSec), col)
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", col, strings.Join(path, " "))
		ly := top + 10 + float64(i)*20
		fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="%s" stroke-width="2"/>`+"\n", left+pw+15, ly, left+pw+35, ly, col)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f">%s</text>`+"\n", left+pw+40, ly+4, name)
	}
	b.WriteString("</svg>\n")
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func human(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%.0fk", v/1000)
	}
	return fmt.Sprintf("%.0f", v)
}
