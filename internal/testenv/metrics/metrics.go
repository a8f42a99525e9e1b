// Package metrics reads Prometheus metrics in tests as Prometheus does: an endpoint's text
// exposition parsed by Prometheus' own parser (or a Gatherer's families), then looked up by
// the series names and labels a PromQL query would use: a histogram h is read as h_count,
// h_sum and h_bucket{le="…"}.
package metrics

import (
	"fmt"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families are the metric families of one scrape or gather, by family name.
type Families map[string]*dto.MetricFamily

// Scrape GETs url, a /metrics endpoint, and parses the answer; it fails t if either fails.
func Scrape(t testing.TB, url string) Families {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scraping %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scraping %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing %s: %v", url, err)
	}
	return mfs
}

// Gather collects g's families, e.g. controller-runtime's metrics.Registry, which a
// manager serves; it fails t if g fails.
func Gather(t testing.TB, g prometheus.Gatherer) Families {
	t.Helper()
	list, err := g.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	mfs := make(Families, len(list))
	for _, mf := range list {
		mfs[mf.GetName()] = mf
	}
	return mfs
}

// Sample is the value of the series name{labels}, labels being all of its labels (as in
// the exposition); ok is false if there is no such series.
func (f Families) Sample(name string, labels map[string]string) (v float64, ok bool) {
	for _, s := range f.series(name) {
		if includes(s.labels, labels) && includes(labels, s.labels) {
			return s.value, true
		}
	}
	return 0, false
}

// Sum is sum(name{labels}): the values of the series whose labels include labels, added;
// 0 if there are none. Nil labels sum the whole family.
func (f Families) Sum(name string, labels map[string]string) float64 {
	var sum float64
	for _, s := range f.series(name) {
		if includes(s.labels, labels) {
			sum += s.value
		}
	}
	return sum
}

// Format shows name's series as the exposition does, one a line, for a failure message.
func (f Families) Format(name string) string {
	var lines []string
	for _, s := range f.series(name) {
		keys := make([]string, 0, len(s.labels))
		for k := range s.labels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		pairs := make([]string, len(keys))
		for i, k := range keys {
			pairs[i] = fmt.Sprintf("%s=%q", k, s.labels[k])
		}
		lines = append(lines, fmt.Sprintf("%s{%s} %v", name, strings.Join(pairs, ","), s.value))
	}
	if len(lines) == 0 {
		return name + ": no series"
	}
	return strings.Join(lines, "\n")
}

type series struct {
	labels map[string]string
	value  float64
}

// series are the samples the exposition shows under name: a counter, gauge or untyped
// family's own samples, a summary's quantiles, or the _count, _sum or _bucket series of a
// histogram or summary.
func (f Families) series(name string) []series {
	if mf := f[name]; mf != nil {
		var out []series
		for _, m := range mf.GetMetric() {
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out = append(out, series{labelsOf(m), m.GetCounter().GetValue()})
			case dto.MetricType_GAUGE:
				out = append(out, series{labelsOf(m), m.GetGauge().GetValue()})
			case dto.MetricType_UNTYPED:
				out = append(out, series{labelsOf(m), m.GetUntyped().GetValue()})
			case dto.MetricType_SUMMARY:
				for _, q := range m.GetSummary().GetQuantile() {
					out = append(out, series{withLabel(m, "quantile", formatFloat(q.GetQuantile())), q.GetValue()})
				}
			}
		}
		return out
	}
	for _, suffix := range []string{"_count", "_sum", "_bucket"} {
		base, ok := strings.CutSuffix(name, suffix)
		mf := f[base]
		if !ok || mf == nil {
			continue
		}
		var out []series
		for _, m := range mf.GetMetric() {
			h, s := m.GetHistogram(), m.GetSummary()
			switch {
			case suffix == "_count" && h != nil:
				out = append(out, series{labelsOf(m), float64(h.GetSampleCount())})
			case suffix == "_count" && s != nil:
				out = append(out, series{labelsOf(m), float64(s.GetSampleCount())})
			case suffix == "_sum" && h != nil:
				out = append(out, series{labelsOf(m), h.GetSampleSum()})
			case suffix == "_sum" && s != nil:
				out = append(out, series{labelsOf(m), s.GetSampleSum()})
			case suffix == "_bucket" && h != nil:
				for _, b := range h.GetBucket() {
					out = append(out, series{withLabel(m, "le", formatFloat(b.GetUpperBound())), float64(b.GetCumulativeCount())})
				}
				// The exposition always ends with the +Inf bucket; the parsed form may not.
				if n := len(h.GetBucket()); n == 0 || !math.IsInf(h.GetBucket()[n-1].GetUpperBound(), 1) {
					out = append(out, series{withLabel(m, "le", "+Inf"), float64(h.GetSampleCount())})
				}
			}
		}
		return out
	}
	return nil
}

func labelsOf(m *dto.Metric) map[string]string {
	l := make(map[string]string, len(m.GetLabel()))
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l
}

func withLabel(m *dto.Metric, name, value string) map[string]string {
	l := labelsOf(m)
	l[name] = value
	return l
}

// includes tells whether have matches every label of want; as in PromQL, an empty value
// matches a label that is not there.
func includes(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// formatFloat writes le and quantile values as client_golang does, so {le: "0.5"} and
// {le: "+Inf"} match what an exposition shows.
func formatFloat(v float64) string {
	if math.IsInf(v, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
