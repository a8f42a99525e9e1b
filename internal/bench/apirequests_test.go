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
`

const expositionAfter = `# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="library.crdipc.io",resource="books",scope="resource",subresource="",verb="POST",version="v1alpha1"} 12
apiserver_request_total{code="200",component="apiserver",dry_run="",group="library.crdipc.io",resource="books",scope="resource",subresource="status",verb="PUT",version="v1alpha1"} 12
apiserver_request_total{code="409",component="apiserver",dry_run="",group="library.crdipc.io",resource="books",scope="resource",subresource="status",verb="PUT",version="v1alpha1"} 1
apiserver_request_total{code="200",component="apiserver",dry_run="",group="library.crdipc.io",resource="books",scope="namespace",subresource="",verb="WATCH",version="v1alpha1"} 2
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="events",scope="resource",subresource="",verb="POST",version="v1"} 12
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 53
apiserver_request_total{code="200",component="",dry_run="",group="",resource="",scope="",subresource="",verb="GET",version=""} 9
`

// TestPerOperation: the requests of a phase to the path's resources, per operation,
// writes apart from round trips and failures apart from successes; writes to other
// resources in total, and requests that name no resource not at all.
func TestPerOperation(t *testing.T) {
	read := func(text string) requestCounts {
		t.Helper()
		families, err := parseMetrics(strings.NewReader(text))
		if err != nil {
			t.Fatal(err)
		}
		mf := families[requestTotal]
		if mf == nil {
			t.Fatalf("no %s in %q", requestTotal, text)
		}
		return parseRequestTotal(mf)
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
	if r.Operations != 2 || len(r.Counted) != len(roundTripPath) {
		t.Errorf("operations %d, counted %v", r.Operations, r.Counted)
	}
}
