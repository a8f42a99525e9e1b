package bench

import (
	"math"
	"strings"
	"testing"
)

// exposition is apiserver_request_total as the API server's /metrics shows it, before and
// after a phase of two Calls.
const expositionBefore = `# HELP apiserver_request_total [STABLE] Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, component, and HTTP response code.
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="library.crdipc.io",resource="books",scope="resource",subresource="",verb="POST",version="v1alpha1"} 10
apiserver_request_total{code="200",component="apiserver",dry_run="",group="library.crdipc.io",resource="books",scope="resource",subresource="status",verb="PUT",version="v1alpha1"} 10
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="events",scope="resource",subresource="",verb="POST",version="v1"} 10
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 50
apiserver_request_total{code="200",component="",dry_run="",group="",resource="",scope="",subresource="",verb="GET",version=""} 7
# TYPE etcd_requests_total counter
etcd_requests_total{group="library.crdipc.io",operation="create",resource="books"} 10
etcd_requests_total{group="library.crdipc.io",operation="update",resource="books"} 10
etcd_requests_total{group="",operation="create",resource="events"} 10
etcd_requests_total{group="coordination.k8s.io",operation="update",resource="leases"} 50
# TYPE apiserver_watch_events_total counter
apiserver_watch_events_total{group="library.crdipc.io",resource="books",version="v1alpha1"} 20
apiserver_watch_events_total{group="coordination.k8s.io",resource="leases",version="v1"} 40
`

const expositionAfter = `# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="library.crdipc.io",resource="books",scope="resource",subresource="",verb="POST",version="v1alpha1"} 12
apiserver_request_total{code="200",component="apiserver",dry_run="",group="library.crdipc.io",resource="books",scope="resource",subresource="status",verb="PUT",version="v1alpha1"} 12
apiserver_request_total{code="409",component="apiserver",dry_run="",group="library.crdipc.io",resource="books",scope="resource",subresource="status",verb="PUT",version="v1alpha1"} 1
apiserver_request_total{code="200",component="apiserver",dry_run="",group="library.crdipc.io",resource="books",scope="namespace",subresource="",verb="WATCH",version="v1alpha1"} 2
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="events",scope="resource",subresource="",verb="POST",version="v1"} 12
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 53
apiserver_request_total{code="200",component="",dry_run="",group="",resource="",scope="",subresource="",verb="GET",version=""} 9
# TYPE etcd_requests_total counter
etcd_requests_total{group="library.crdipc.io",operation="create",resource="books"} 12
etcd_requests_total{group="library.crdipc.io",operation="update",resource="books"} 13
etcd_requests_total{group="library.crdipc.io",operation="get",resource="books"} 1
etcd_requests_total{group="",operation="create",resource="events"} 12
etcd_requests_total{group="coordination.k8s.io",operation="update",resource="leases"} 53
# TYPE apiserver_watch_events_total counter
apiserver_watch_events_total{group="library.crdipc.io",resource="books",version="v1alpha1"} 28
apiserver_watch_events_total{group="library.crdipc.io",resource="books",version="v1"} 2
apiserver_watch_events_total{group="coordination.k8s.io",resource="leases",version="v1"} 46
`

// TestPerOperation: the requests of a phase to the path's resources, per operation,
// writes apart from round trips and failures apart from successes; writes to other
// resources in total, and requests that name no resource not at all; etcd requests and
// watch events sent for the path's resources, per operation, summed over versions.
func TestPerOperation(t *testing.T) {
	read := func(text string) serverCounts {
		t.Helper()
		families, err := parseMetrics(strings.NewReader(text))
		if err != nil {
			t.Fatal(err)
		}
		c, err := parseServerCounts(families, "test")
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	r := perOperation(read(expositionBefore), read(expositionAfter), roundTripPath, 2)
	wantWrites := map[string]float64{"create books": 1, "update books/status": 1, "update books/status (409)": 0.5, "create events": 1}
	wantReads := map[string]float64{"watch books": 1}
	same := func(got, want map[string]float64) bool {
		if len(got) != len(want) {
			return false
		}
		for k, v := range want {
			if math.Abs(got[k]-v) > 1e-9 {
				return false
			}
		}
		return true
	}
	if !same(r.WritesBy, wantWrites) || r.Writes != 3.5 {
		t.Errorf("writes %v by %v, want 3.5 by %v", r.Writes, r.WritesBy, wantWrites)
	}
	if !same(r.ReadsBy, wantReads) || r.Reads != 1 {
		t.Errorf("reads %v by %v, want 1 by %v", r.Reads, r.ReadsBy, wantReads)
	}
	if !same(r.OtherWrites, map[string]float64{"update leases.coordination.k8s.io": 3}) {
		t.Errorf("other writes %v, want the 3 Lease updates, in total", r.OtherWrites)
	}
	if w := r.writesTo(roundTripPath[0]); w != 2.5 {
		t.Errorf("writes to Books %v, want 2.5", w)
	}
	if !same(r.EtcdBy, map[string]float64{"create books": 1, "update books": 1.5, "get books": 0.5, "create events": 1}) || r.Etcd != 4 {
		t.Errorf("etcd requests %v by %v, want 4: the lease updates are not the path's", r.Etcd, r.EtcdBy)
	}
	if !same(r.WatchEventsBy, map[string]float64{"books": 5}) || r.WatchEvents != 5 {
		t.Errorf("watch events %v by %v, want 5 (both versions of books, no leases)", r.WatchEvents, r.WatchEventsBy)
	}
	if r.Operations != 2 || len(r.Counted) != len(roundTripPath) {
		t.Errorf("operations %d, counted %v", r.Operations, r.Counted)
	}
}

// TestServerCountsWithoutStorageMetrics: a server that does not expose the ALPHA etcd and
// watch counters still has its requests counted; one without apiserver_request_total is an
// error that names it.
func TestServerCountsWithoutStorageMetrics(t *testing.T) {
	families, err := parseMetrics(strings.NewReader(expositionBefore[:strings.Index(expositionBefore, "# TYPE etcd_requests_total")]))
	if err != nil {
		t.Fatal(err)
	}
	c, err := parseServerCounts(families, "test")
	if err != nil || len(c.requests) == 0 || len(c.etcd) != 0 || len(c.watchEvents) != 0 {
		t.Errorf("got %+v, %v; want the requests only", c, err)
	}
	delete(families, requestTotal)
	if _, err := parseServerCounts(families, "test server"); err == nil || !strings.Contains(err.Error(), "test server has no "+requestTotal) {
		t.Errorf("got %v, want an error naming the missing counter", err)
	}
}
