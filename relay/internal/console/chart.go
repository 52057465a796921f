package console

import (
	"strconv"
	"strings"
	"time"

	"github.com/heraldhq/herald/relay/internal/throughput"
)

// chartHeight is the chart's drawing height in its own units; its width is
// one unit per point, and the stylesheet stretches it to the cell.
const chartHeight = 40

// chartView is a throughput chart: two polylines in an SVG drawn by the
// overview template from numbers only, so nothing in it needs escaping.
type chartView struct {
	Width, Height int
	// Delivered and Failed are the polylines' points ("x,y x,y ...").
	Delivered, Failed string
	// Max is the per-second rate at the top of the chart.
	Max float64
	// From and To are the times of the first and last points.
	From, To time.Time
	// Empty says there is nothing to draw.
	Empty bool
}

// chart scales the series (oldest first) to the drawing: y grows
// downwards, so a rate r is drawn at height - r/max*height.
func chart(series []throughput.Point) chartView {
	v := chartView{Width: max(len(series)-1, 1), Height: chartHeight, Empty: len(series) == 0}
	if v.Empty {
		return v
	}
	v.From, v.To = series[0].At, series[len(series)-1].At
	for _, p := range series {
		v.Max = max(v.Max, p.Delivered, p.Failed)
	}
	scale := 0.0
	if v.Max > 0 {
		scale = chartHeight / v.Max
	}
	var delivered, failed strings.Builder
	for i, p := range series {
		x := strconv.Itoa(i)
		delivered.WriteString(x + "," + strconv.FormatFloat(chartHeight-p.Delivered*scale, 'f', 1, 64) + " ")
		failed.WriteString(x + "," + strconv.FormatFloat(chartHeight-p.Failed*scale, 'f', 1, 64) + " ")
	}
	v.Delivered, v.Failed = strings.TrimSpace(delivered.String()), strings.TrimSpace(failed.String())
	return v
}
