package metricsagent

import (
	"github.com/prometheus/client_golang/prometheus"

	scmv1alpha1 "github.com/crdipc/crdipc/api/scm/v1alpha1"
)

var (
	pullRequestsDesc = prometheus.NewDesc("crdipc_scm_pullrequests",
		"PullRequests by state: open, closed (not merged), merged.", []string{"state"}, nil)
	branchesDesc = prometheus.NewDesc("crdipc_scm_branches",
		"Branches by state: created, pushed, deleted.", []string{"state"}, nil)
)

// gauges reads the informer caches at scrape time, so the values are the resources' current
// state with no bookkeeping to go wrong across restarts. Every state is always exported, at 0
// when empty, so a query never sees a series vanish.
type gauges struct{ a *Agent }

func (g *gauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- pullRequestsDesc
	ch <- branchesDesc
}

func (g *gauges) Collect(ch chan<- prometheus.Metric) {
	// Before the caches hold a full list the numbers would be too low; export nothing rather
	// than something wrong.
	if g.a.start.Load() == nil || !g.a.prs.HasSynced() || !g.a.branches.HasSynced() {
		return
	}
	prs := map[string]int{"open": 0, "closed": 0, "merged": 0}
	for _, obj := range g.a.prs.GetStore().List() {
		pr, ok := obj.(*scmv1alpha1.PullRequest)
		if !ok {
			continue
		}
		switch {
		case pr.Spec.Status == scmv1alpha1.PullRequestOpen:
			prs["open"]++
		case pr.Spec.Merged:
			prs["merged"]++
		default:
			prs["closed"]++
		}
	}
	branches := map[string]int{string(scmv1alpha1.BranchCreated): 0, string(scmv1alpha1.BranchPushed): 0, string(scmv1alpha1.BranchDeleted): 0}
	for _, obj := range g.a.branches.GetStore().List() {
		if b, ok := obj.(*scmv1alpha1.Branch); ok {
			if _, known := branches[string(b.Spec.State)]; known {
				branches[string(b.Spec.State)]++
			}
		}
	}
	for state, n := range prs {
		ch <- prometheus.MustNewConstMetric(pullRequestsDesc, prometheus.GaugeValue, float64(n), state)
	}
	for state, n := range branches {
		ch <- prometheus.MustNewConstMetric(branchesDesc, prometheus.GaugeValue, float64(n), state)
	}
}
