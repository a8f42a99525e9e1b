// Package plot draws the results of `crdipc bench all` (a bench.All) as PNG figures that
// people read at a glance, for docs/performance.md: latency distributions against the
// floor, throughput against its ceiling, the costs of scale against the number of Books,
// and the volume data path against a local file. Goals are drawn as lines where the
// benches have them.
package plot
