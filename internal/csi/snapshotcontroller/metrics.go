package snapshotcontroller

import (
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// metricsPrefix names upstream's snapshot controller metrics
// (snapshot_controller_operation_total_seconds, snapshot_controller_operations_in_flight).
const metricsPrefix = "snapshot_controller_"

// running is the registry of the snapshot controller running in this process, if any;
// served is registered with controller-runtime's registry, which every crdipc service
// serves on /metrics, once per process. A controller's registry is set while it runs, so a
// process that runs several in turn (tests; a leader that lost its lease) serves the
// current one's and never two series of the same name.
var (
	running    atomic.Pointer[prometheus.Gatherer]
	serveOnce  sync.Once
	served     = &gathered{g: &running, prefix: metricsPrefix}
	serveError error
)

// serve registers served with controller-runtime's registry.
func serve() error {
	serveOnce.Do(func() { serveError = ctrlmetrics.Registry.Register(served) })
	return serveError
}

// gathered is a Collector of the families whose names start with prefix of the Gatherer g
// points to: upstream keeps its metrics in a registry of its own (component-base's
// KubeRegistry), and this brings them to the registry crdipc serves. The rest of that
// registry (its process_start_time_seconds) is left out: the serving registry has its own.
type gathered struct {
	g      *atomic.Pointer[prometheus.Gatherer]
	prefix string
}

// Describe sends nothing: the families are known only when gathered (an unchecked
// collector).
func (*gathered) Describe(chan<- *prometheus.Desc) {}

func (c *gathered) Collect(ch chan<- prometheus.Metric) {
	g := c.g.Load()
	if g == nil {
		return
	}
	mfs, err := (*g).Gather()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(prometheus.NewDesc(c.prefix+"gather_error", "", nil, nil), err)
		return
	}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), c.prefix) {
			continue
		}
		for _, m := range mf.GetMetric() {
			if cm, err := constMetric(mf, m); err != nil {
				ch <- prometheus.NewInvalidMetric(prometheus.NewDesc(mf.GetName(), mf.GetHelp(), nil, nil), err)
			} else if cm != nil {
				ch <- cm
			}
		}
	}
}

// constMetric is one gathered sample as a const metric of the same type; nil for a type it
// does not carry (summaries: upstream has none).
func constMetric(mf *dto.MetricFamily, m *dto.Metric) (prometheus.Metric, error) {
	var names, values []string
	for _, l := range m.GetLabel() {
		names = append(names, l.GetName())
		values = append(values, l.GetValue())
	}
	desc := prometheus.NewDesc(mf.GetName(), mf.GetHelp(), names, nil)
	switch mf.GetType() {
	case dto.MetricType_COUNTER:
		return prometheus.NewConstMetric(desc, prometheus.CounterValue, m.GetCounter().GetValue(), values...)
	case dto.MetricType_GAUGE:
		return prometheus.NewConstMetric(desc, prometheus.GaugeValue, m.GetGauge().GetValue(), values...)
	case dto.MetricType_UNTYPED:
		return prometheus.NewConstMetric(desc, prometheus.UntypedValue, m.GetUntyped().GetValue(), values...)
	case dto.MetricType_HISTOGRAM:
		h := m.GetHistogram()
		buckets := make(map[float64]uint64, len(h.GetBucket()))
		for _, b := range h.GetBucket() {
			buckets[b.GetUpperBound()] = b.GetCumulativeCount()
		}
		return prometheus.NewConstHistogram(desc, h.GetSampleCount(), h.GetSampleSum(), buckets, values...)
	}
	return nil, nil
}
