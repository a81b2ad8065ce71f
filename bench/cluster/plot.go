package cluster

import (
	"cmp"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
)

// PlotTTFT draws TTFT p90 (log scale) against request rate, one line per
// policy, with the 2 s SLO, as a PNG.
func PlotTTFT(w io.Writer, title string, runs []Result) error {
	var series []Series
	at := map[string]int{}
	runs = slices.Clone(runs)
	slices.SortStableFunc(runs, func(a, b Result) int { return cmp.Compare(a.Rate, b.Rate) })
	for _, r := range runs {
		i, ok := at[r.Policy]
		if !ok {
			i = len(series)
			at[r.Policy] = i
			series = append(series, Series{Name: r.Policy})
		}
		series[i].X = append(series[i].X, r.Rate)
		series[i].Y = append(series[i].Y, r.TTFTP90)
	}
	return PlotLog(w, PlotSpec{Title: title, XLabel: "request rate (req/s)", YLabel: "ttft p90 (s, log)",
		SLO: 2, SLOLabel: "slo p90 2 s", MinY: 0.05, MaxY: 4}, series)
}

// Series is one line of a plot: points (X[i], Y[i]).
type Series struct {
	Name string
	X, Y []float64
}

// PlotSpec labels a plot. The y axis is logarithmic and spans at least
// [MinY, MaxY]; SLO, when positive, is drawn as a dashed red line.
type PlotSpec struct {
	Title, XLabel, YLabel string
	SLO                   float64
	SLOLabel              string
	MinY, MaxY            float64
}

// PlotLog draws series against a linear x and a logarithmic y axis as a PNG.
// Only the standard library is used: a small 5×7 bitmap font is built in.
func PlotLog(w io.Writer, spec PlotSpec, series []Series) error {
	const (
		W, H                     = 960, 600
		left, right, top, bottom = 80, 200, 50, 60
	)
	img := image.NewRGBA(image.Rect(0, 0, W, H))
	fill(img, img.Bounds(), color.RGBA{255, 255, 255, 255})
	maxX, minY, maxY := 0.0, spec.MinY, spec.MaxY
	for _, sr := range series {
		for i, x := range sr.X {
			maxX = math.Max(maxX, x)
			if y := sr.Y[i]; y > 0 {
				maxY, minY = math.Max(maxY, y), math.Min(minY, y)
			}
		}
	}
	if maxX == 0 {
		maxX = 1
	}
	lo, hi := math.Floor(math.Log10(minY)), math.Ceil(math.Log10(maxY))
	px := func(x float64) int { return left + int(x/maxX*float64(W-left-right)) }
	py := func(v float64) int {
		v = math.Max(v, math.Pow(10, lo))
		f := (math.Log10(v) - lo) / (hi - lo)
		return H - bottom - int(f*float64(H-top-bottom))
	}
	black, grey := color.RGBA{0, 0, 0, 255}, color.RGBA{220, 220, 220, 255}
	// Grid and axes.
	for e := lo; e <= hi; e++ {
		y := py(math.Pow(10, e))
		hline(img, left, W-right, y, grey)
		text(img, left-8-textWidth(fmtSeconds(math.Pow(10, e))), y-3, fmtSeconds(math.Pow(10, e)), black)
	}
	for i := 0; i <= 5; i++ {
		x := maxX * float64(i) / 5
		vline(img, px(x), top, H-bottom, grey)
		s := fmt.Sprintf("%.1f", x)
		text(img, px(x)-textWidth(s)/2, H-bottom+8, s, black)
	}
	hline(img, left, W-right, H-bottom, black)
	vline(img, left, top, H-bottom, black)
	if spec.SLO > 0 {
		red, slo := color.RGBA{200, 0, 0, 255}, py(spec.SLO)
		for x := left; x < W-right; x += 6 {
			hline(img, x, x+3, slo, red)
		}
		text(img, W-right-textWidth(spec.SLOLabel)-4, slo-10, spec.SLOLabel, red)
	}
	text(img, (W-textWidth(spec.Title))/2, 18, spec.Title, black)
	text(img, left+(W-left-right-textWidth(spec.XLabel))/2, H-bottom+26, spec.XLabel, black)
	text(img, 8, top-18, spec.YLabel, black)
	drawSeries(img, series, px, py, W-right, top)
	return png.Encode(w, img)
}

// drawSeries draws each series sorted by x, and its legend entry right of
// legendX.
func drawSeries(img *image.RGBA, series []Series, px, py func(float64) int, legendX, top int) {
	palette := []color.RGBA{{31, 119, 180, 255}, {255, 127, 14, 255}, {44, 160, 44, 255}, {148, 103, 189, 255}, {214, 39, 40, 255}, {140, 86, 75, 255}, {23, 190, 207, 255}, {188, 189, 34, 255}, {227, 119, 194, 255}, {127, 127, 127, 255}, {0, 0, 128, 255}}
	for i, sr := range series {
		c := palette[i%len(palette)]
		order := make([]int, len(sr.X))
		for j := range order {
			order[j] = j
		}
		sort.SliceStable(order, func(a, b int) bool { return sr.X[order[a]] < sr.X[order[b]] })
		for j, k := range order {
			x, y := px(sr.X[k]), py(sr.Y[k])
			fill(img, image.Rect(x-3, y-3, x+4, y+4), c)
			if j > 0 {
				line(img, px(sr.X[order[j-1]]), py(sr.Y[order[j-1]]), x, y, c)
			}
		}
		ly := top + 10 + 18*i
		fill(img, image.Rect(legendX+16, ly, legendX+36, ly+4), c)
		text(img, legendX+42, ly-1, sr.Name, color.RGBA{0, 0, 0, 255})
	}
}

func fmtSeconds(v float64) string {
	if v >= 1 {
		return fmt.Sprintf("%.0f", v)
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.3f", v), "0"), ".")
}

func fill(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			img.SetRGBA(x, y, c)
		}
	}
}

func hline(img *image.RGBA, x0, x1, y int, c color.RGBA) { fill(img, image.Rect(x0, y, x1+1, y+1), c) }
func vline(img *image.RGBA, x, y0, y1 int, c color.RGBA) { fill(img, image.Rect(x, y0, x+1, y1+1), c) }

// line draws a 2-pixel-wide segment (Bresenham).
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	err := dx + dy
	for {
		fill(img, image.Rect(x0, y0, x0+2, y0+2), c)
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * err
		if e2 >= dy {
			err += dy
			x0 += sx
		}
		if e2 <= dx {
			err += dx
			y0 += sy
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func sign(v int) int {
	switch {
	case v < 0:
		return -1
	case v > 0:
		return 1
	}
	return 0
}

// glyphs is a 5×7 font: seven rows of five pixels per character.
var glyphs = map[rune][7]string{
	'a': {".....", ".....", ".###.", "....#", ".####", "#...#", ".####"},
	'b': {"#....", "#....", "####.", "#...#", "#...#", "#...#", "####."},
	'c': {".....", ".....", ".###.", "#....", "#....", "#...#", ".###."},
	'd': {"....#", "....#", ".####", "#...#", "#...#", "#...#", ".####"},
	'e': {".....", ".....", ".###.", "#...#", "#####", "#....", ".###."},
	'f': {"..##.", ".#..#", ".#...", "###..", ".#...", ".#...", ".#..."},
	'g': {".....", ".####", "#...#", "#...#", ".####", "....#", ".###."},
	'h': {"#....", "#....", "#.##.", "##..#", "#...#", "#...#", "#...#"},
	'i': {"..#..", ".....", ".##..", "..#..", "..#..", "..#..", ".###."},
	'j': {"...#.", ".....", "..##.", "...#.", "...#.", "#..#.", ".##.."},
	'k': {"#....", "#....", "#..#.", "#.#..", "##...", "#.#..", "#..#."},
	'l': {".##..", "..#..", "..#..", "..#..", "..#..", "..#..", ".###."},
	'm': {".....", ".....", "##.#.", "#.#.#", "#.#.#", "#...#", "#...#"},
	'n': {".....", ".....", "#.##.", "##..#", "#...#", "#...#", "#...#"},
	'o': {".....", ".....", ".###.", "#...#", "#...#", "#...#", ".###."},
	'p': {".....", ".....", "####.", "#...#", "####.", "#....", "#...."},
	'q': {".....", ".....", ".####", "#...#", ".####", "....#", "....#"},
	'r': {".....", ".....", "#.##.", "##..#", "#....", "#....", "#...."},
	's': {".....", ".....", ".####", "#....", ".###.", "....#", "####."},
	't': {".#...", ".#...", "###..", ".#...", ".#...", ".#..#", "..##."},
	'u': {".....", ".....", "#...#", "#...#", "#...#", "#..##", ".##.#"},
	'v': {".....", ".....", "#...#", "#...#", "#...#", ".#.#.", "..#.."},
	'w': {".....", ".....", "#...#", "#...#", "#.#.#", "#.#.#", ".#.#."},
	'x': {".....", ".....", "#...#", ".#.#.", "..#..", ".#.#.", "#...#"},
	'y': {".....", ".....", "#...#", "#...#", ".####", "....#", ".###."},
	'z': {".....", ".....", "#####", "...#.", "..#..", ".#...", "#####"},
	'0': {".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."},
	'1': {"..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."},
	'2': {".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"},
	'3': {"#####", "...#.", "..#..", "...#.", "....#", "#...#", ".###."},
	'4': {"...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."},
	'5': {"#####", "#....", "####.", "....#", "....#", "#...#", ".###."},
	'6': {"..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."},
	'7': {"#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."},
	'8': {".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."},
	'9': {".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."},
	'.': {".....", ".....", ".....", ".....", ".....", ".##..", ".##.."},
	',': {".....", ".....", ".....", ".....", ".##..", "..#..", ".#..."},
	'-': {".....", ".....", ".....", "#####", ".....", ".....", "....."},
	'_': {".....", ".....", ".....", ".....", ".....", ".....", "#####"},
	'(': {"...#.", "..#..", ".#...", ".#...", ".#...", "..#..", "...#."},
	')': {".#...", "..#..", "...#.", "...#.", "...#.", "..#..", ".#..."},
	'/': {".....", "....#", "...#.", "..#..", ".#...", "#....", "....."},
	':': {".....", ".##..", ".##..", ".....", ".##..", ".##..", "....."},
	'=': {".....", ".....", "#####", ".....", "#####", ".....", "....."},
	'%': {"##...", "##..#", "...#.", "..#..", ".#...", "#..##", "...##"},
	'<': {"...#.", "..#..", ".#...", "#....", ".#...", "..#..", "...#."},
	'>': {".#...", "..#..", "...#.", "....#", "...#.", "..#..", ".#..."},
	'+': {".....", "..#..", "..#..", "#####", "..#..", "..#..", "....."},
}

func textWidth(s string) int { return 6 * len([]rune(s)) }

// text draws s with its top-left corner at (x, y); letters are drawn in
// lower case, unknown characters as blanks.
func text(img *image.RGBA, x, y int, s string, c color.RGBA) {
	for _, r := range strings.ToLower(s) {
		if g, ok := glyphs[r]; ok {
			for row, bits := range g {
				for col, b := range bits {
					if b == '#' {
						img.SetRGBA(x+col, y+row, c)
					}
				}
			}
		}
		x += 6
	}
}
