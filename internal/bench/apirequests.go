package bench

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/metrics/legacyregistry"
)

// A critical path's cost in API requests is counted by the API server itself: its
// apiserver_request_total, one increment per request it served, whatever the outcome, by
// verb, group, resource, subresource and code. Read before and after a phase of the bench
// that nothing else loads, and divided by the operations of that phase, it is exact where
// watching the objects is not: a watch sees only writes that changed an object, not a
// conflict, a no-op update or a read.

// requestTotal is the API server's request counter; etcdRequestsTotal counts the requests
// it makes to etcd, by operation and resource, and watchEventsTotal the events it sends its
// watchers, by resource. The last two say what a path costs behind the requests: a
// request that needs a second etcd read (an update whose cached object was stale), and
// the watch events every watcher of a resource (informers, a Call's own watch) costs.
const (
	requestTotal      = "apiserver_request_total"
	etcdRequestsTotal = "etcd_requests_total"
	watchEventsTotal  = "apiserver_watch_events_total"
)

// APIRequests are the API requests of one critical path, per operation of a phase.
type APIRequests struct {
	// Phase is what was counted; Operations how many operations (Calls, deliveries,
	// volumes) it made. Every figure below but OtherWrites is per operation.
	Phase      string `json:"phase"`
	Operations int    `json:"operations"`
	// Source is where the counter was read: this process's registry (the embedded control
	// plane) or the API server's /metrics.
	Source string `json:"source"`
	// Counted are the resources counted, as resource.group ("*.group": all of the group's;
	// "events": core Events). Other clients' requests to them in the interval count too.
	Counted []string `json:"counted"`
	// Writes are create, update, patch, apply and delete requests; WritesBy divides them by
	// "verb resource[/subresource]", with " (code)" for those that failed ("update
	// books/status (409)").
	Writes   float64            `json:"writes"`
	WritesBy map[string]float64 `json:"writesBy"`
	// Reads are the round trips that write nothing: get, list, and watch, which the API
	// server counts when it ends (an informer's watch that outlives the phase is not in it).
	Reads   float64            `json:"reads"`
	ReadsBy map[string]float64 `json:"readsBy"`
	// OtherWrites are the writes to resources not counted during the interval, in total
	// (not per operation): what restricting the count to the path's resources left out
	// (Leases of the control plane, for one).
	OtherWrites map[string]float64 `json:"otherWrites,omitempty"`
	// Etcd are the requests the API server made to etcd for the path's resources; EtcdBy
	// divides them by "operation resource" (etcd_requests_total).
	Etcd   float64            `json:"etcd"`
	EtcdBy map[string]float64 `json:"etcdBy,omitempty"`
	// WatchEvents are the events the API server sent to watchers of the path's resources,
	// whoever they are (apiserver_watch_events_total); WatchEventsBy divides them by
	// resource.
	WatchEvents   float64            `json:"watchEvents"`
	WatchEventsBy map[string]float64 `json:"watchEventsBy,omitempty"`
	// Unsettled says the counter still moved when the bench stopped waiting for the
	// requests before the phase, or the phase's last ones, to end: the counts may be a few
	// off.
	Unsettled bool `json:"unsettled,omitempty"`

	// writes are Writes by series, per operation, for WritesTo.
	writes map[requestKey]float64
}

// apiPath names the resources of a critical path; Resource "*" is every resource of Group.
type apiPath []schema.GroupResource

func (p apiPath) has(group, resource string) bool {
	for _, gr := range p {
		if gr.Group == group && (gr.Resource == "*" || gr.Resource == resource) {
			return true
		}
	}
	return false
}

func (p apiPath) names() []string {
	names := make([]string, len(p))
	for i, gr := range p {
		names[i] = gr.String()
	}
	return names
}

// events are the Events a path records: core/v1 ones (ipc's receivers, the webhook
// listener) and events.k8s.io ones (controller-runtime's recorders).
var events = []schema.GroupResource{{Resource: "events"}, {Group: "events.k8s.io", Resource: "events"}}

// pathOf is the path of every resource of group, and Events.
func pathOf(group string) apiPath {
	return append(apiPath{{Group: group, Resource: "*"}}, events...)
}

// requestKey is one series of apiserver_request_total as far as the benches tell them
// apart; Code is empty for a success (2xx).
type requestKey struct {
	Verb, Group, Resource, Subresource, Code string
}

// name is "verb resource[/subresource]" with the verb as kubectl says it, and " (code)"
// for a failure.
func (k requestKey) name() string {
	n := verbName(k.Verb) + " " + resourceName(k.Group, k.Resource)
	if k.Subresource != "" {
		n += "/" + k.Subresource
	}
	if k.Code != "" {
		n += " (" + k.Code + ")"
	}
	return n
}

func (k requestKey) groupResource() (string, string) { return k.Group, k.Resource }

// write says whether a request of verb k.Verb writes (the API server's verbs are HTTP
// methods, with LIST, WATCH and APPLY told apart).
func (k requestKey) write() bool {
	switch k.Verb {
	case "POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION":
		return true
	}
	return false
}

// resourceName is the resource with its group, unless core or crdipc's own (whose resource
// names are unique).
func resourceName(group, resource string) string {
	if group != "" && !strings.HasSuffix(group, ".crdipc.io") {
		return resource + "." + group
	}
	return resource
}

func verbName(v string) string {
	switch v {
	case "POST":
		return "create"
	case "PUT":
		return "update"
	}
	return strings.ToLower(v)
}

type requestCounts map[requestKey]float64

// storageKey is a series of etcd_requests_total (Operation set) or of
// apiserver_watch_events_total (Operation empty).
type storageKey struct {
	Operation, Group, Resource string
}

func (k storageKey) groupResource() (string, string) { return k.Group, k.Resource }

func (k storageKey) name() string {
	if k.Operation == "" {
		return resourceName(k.Group, k.Resource)
	}
	return k.Operation + " " + resourceName(k.Group, k.Resource)
}

// serverCounts are one reading of the API server's counters.
type serverCounts struct {
	requests          requestCounts
	etcd, watchEvents map[storageKey]float64
}

// requestCounter reads apiserver_request_total.
type requestCounter struct {
	source string
	read   func(ctx context.Context) (map[string]*dto.MetricFamily, error)
}

// newRequestCounter reads the counter of the API server of cfg: with inProcess, the
// embedded control plane's, from this process's registry, where it registers its metrics;
// else from the API server's /metrics. That answers for one API server only: of a
// cluster with several, the one that answered.
func newRequestCounter(cfg *rest.Config, inProcess bool) (*requestCounter, error) {
	if inProcess {
		return &requestCounter{source: "the embedded control plane's registry in this process", read: func(context.Context) (map[string]*dto.MetricFamily, error) {
			families, err := legacyregistry.DefaultGatherer.Gather()
			byName := make(map[string]*dto.MetricFamily, len(families))
			for _, mf := range families {
				byName[mf.GetName()] = mf
			}
			return byName, err
		}}, nil
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating client: %w", err)
	}
	return &requestCounter{source: cfg.Host + "/metrics", read: func(ctx context.Context) (map[string]*dto.MetricFamily, error) {
		raw, err := kube.CoreV1().RESTClient().Get().AbsPath("/metrics").SetHeader("Accept", "text/plain").DoRaw(ctx)
		if err != nil {
			return nil, fmt.Errorf("reading the API server's /metrics: %w", err)
		}
		return parseMetrics(bytes.NewReader(raw))
	}}, nil
}

// counts reads the counters once. A server without etcd_requests_total or
// apiserver_watch_events_total (they are ALPHA metrics) has its requests counted all the
// same.
func (rc *requestCounter) counts(ctx context.Context) (serverCounts, error) {
	families, err := rc.read(ctx)
	if err != nil {
		return serverCounts{}, err
	}
	return parseServerCounts(families, rc.source)
}

func parseServerCounts(families map[string]*dto.MetricFamily, source string) (serverCounts, error) {
	mf := families[requestTotal]
	if mf == nil {
		return serverCounts{}, fmt.Errorf("%s has no %s", source, requestTotal)
	}
	return serverCounts{
		requests:    parseRequestTotal(mf),
		etcd:        parseStorageCounter(families[etcdRequestsTotal], "operation"),
		watchEvents: parseStorageCounter(families[watchEventsTotal], ""),
	}, nil
}

// parseStorageCounter sums a counter by group, resource and, if op names one, that label.
func parseStorageCounter(mf *dto.MetricFamily, op string) map[storageKey]float64 {
	c := map[storageKey]float64{}
	for _, m := range mf.GetMetric() {
		var k storageKey
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "group":
				k.Group = l.GetValue()
			case "resource":
				k.Resource = l.GetValue()
			case op:
				k.Operation = l.GetValue()
			}
		}
		c[k] += value(m)
	}
	return c
}

func parseRequestTotal(mf *dto.MetricFamily) requestCounts {
	c := requestCounts{}
	for _, m := range mf.GetMetric() {
		var k requestKey
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "verb":
				k.Verb = l.GetValue()
			case "group":
				k.Group = l.GetValue()
			case "resource":
				k.Resource = l.GetValue()
			case "subresource":
				k.Subresource = l.GetValue()
			case "code":
				k.Code = l.GetValue()
			}
		}
		if strings.HasPrefix(k.Code, "2") {
			k.Code = ""
		}
		// Requests that name no resource (/metrics, /healthz, discovery) are nobody's path.
		if k.Resource == "" {
			continue
		}
		c[k] += value(m)
	}
	return c
}

// countSettleInterval and countSettleTimeout: a request is counted when its handler returns, after
// its response went out, and a watch when it ends, after the client stopped it; the
// counter is read until the path's counts stay still for countSettleInterval.
const (
	countSettleInterval = 250 * time.Millisecond
	countSettleTimeout  = 10 * time.Second
)

// settled reads the counter until the path's counts stop moving; unsettled says they
// still moved at countSettleTimeout.
func (rc *requestCounter) settled(ctx context.Context, path apiPath) (c serverCounts, unsettled bool, err error) {
	prev, err := rc.counts(ctx)
	if err != nil {
		return serverCounts{}, false, err
	}
	deadline := time.Now().Add(countSettleTimeout)
	for {
		select {
		case <-ctx.Done():
			return serverCounts{}, false, ctx.Err()
		case <-time.After(countSettleInterval):
		}
		cur, err := rc.counts(ctx)
		if err != nil {
			return serverCounts{}, false, err
		}
		if samePath(prev, cur, path) {
			return cur, false, nil
		}
		if time.Now().After(deadline) {
			return cur, true, nil
		}
		prev = cur
	}
}

func samePath(a, b serverCounts, path apiPath) bool {
	return sameOn(a.requests, b.requests, path) && sameOn(a.etcd, b.etcd, path) && sameOn(a.watchEvents, b.watchEvents, path)
}

// sameOn says whether two readings of a counter agree on every series of path's resources.
func sameOn[K interface {
	comparable
	groupResource() (string, string)
}](a, b map[K]float64, path apiPath) bool {
	for _, c := range []map[K]float64{a, b} {
		for k := range c {
			if path.has(k.groupResource()) && a[k] != b[k] {
				return false
			}
		}
	}
	return true
}

// countRequests counts the API requests of path during run, which makes ops operations.
// The count starts once the requests of what ran before have ended and ends once those of
// run have.
func countRequests(ctx context.Context, rc *requestCounter, path apiPath, phase string, ops int, run func() error) (*APIRequests, error) {
	before, unsettledBefore, err := rc.settled(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("counting API requests: %w", err)
	}
	if err := run(); err != nil {
		return nil, err
	}
	after, unsettled, err := rc.settled(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("counting API requests: %w", err)
	}
	r := perOperation(before, after, path, ops)
	r.Phase, r.Source, r.Unsettled = phase, rc.source, unsettledBefore || unsettled
	return r, nil
}

// perOperation is the difference of two readings divided by ops, for the resources of
// path; the writes to the others are kept in total.
func perOperation(before, after serverCounts, path apiPath, ops int) *APIRequests {
	r := &APIRequests{Operations: ops, Counted: path.names(), WritesBy: map[string]float64{}, ReadsBy: map[string]float64{},
		OtherWrites: map[string]float64{}, writes: map[requestKey]float64{}}
	r.Etcd, r.EtcdBy = perOperationOf(before.etcd, after.etcd, path, ops)
	r.WatchEvents, r.WatchEventsBy = perOperationOf(before.watchEvents, after.watchEvents, path, ops)
	for k, v := range after.requests {
		d := v - before.requests[k]
		if d <= 0 {
			continue
		}
		switch {
		case !path.has(k.Group, k.Resource):
			if k.write() {
				r.OtherWrites[k.name()] += d
			}
		case ops <= 0:
		case k.write():
			r.writes[k] += d / float64(ops)
			r.WritesBy[k.name()] += d / float64(ops)
			r.Writes += d / float64(ops)
		default:
			r.ReadsBy[k.name()] += d / float64(ops)
			r.Reads += d / float64(ops)
		}
	}
	return r
}

// perOperationOf is the growth of a storage counter for the resources of path, per
// operation, in total and by series.
func perOperationOf(before, after map[storageKey]float64, path apiPath, ops int) (float64, map[string]float64) {
	if ops <= 0 {
		return 0, nil
	}
	var total float64
	by := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d > 0 && path.has(k.Group, k.Resource) {
			by[k.name()] += d / float64(ops)
			total += d / float64(ops)
		}
	}
	return total, by
}

// writesTo is the writes per operation to the resources of gr (subresources included).
func (r *APIRequests) writesTo(gr ...schema.GroupResource) float64 {
	var sum float64
	for k, v := range r.writes {
		if apiPath(gr).has(k.Group, k.Resource) {
			sum += v
		}
	}
	return sum
}
