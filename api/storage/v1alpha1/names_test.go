package v1alpha1_test

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/crdipc/crdipc/api/storage/v1alpha1"
)

func TestPoolAndReplicaNames(t *testing.T) {
	if got := v1alpha1.PoolName("sample-claim", "node-1"); got != "sample-claim-node-1" {
		t.Errorf("PoolName = %q", got)
	}
	if got := v1alpha1.ReplicaName("vol", "sample-claim-node-1"); got != "vol-sample-claim-node-1" {
		t.Errorf("ReplicaName = %q", got)
	}
	long := strings.Repeat("a", 60)
	a, b := v1alpha1.PoolName(long, "node-1"), v1alpha1.PoolName(long, "node-2")
	if a == b {
		t.Errorf("long names collide: %q", a)
	}
	if a != v1alpha1.PoolName(long, "node-1") {
		t.Error("PoolName is not deterministic")
	}
	for _, n := range []string{a, b, v1alpha1.ReplicaName(strings.Repeat("v", 51)+".xxxxxxxx", "pool"), v1alpha1.PoolName(strings.Repeat("c.", 40), "node.example.com")} {
		if len(n) > v1alpha1.MaxGeneratedNameLength {
			t.Errorf("%q is %d long", n, len(n))
		}
		if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
			t.Errorf("%q: %v", n, errs)
		}
	}
}

func TestNodeLeaseName(t *testing.T) {
	if got := v1alpha1.NodeLeaseName("node-1"); got != "pool-agent-node-1" {
		t.Errorf("NodeLeaseName = %q", got)
	}
	long := strings.Repeat("n", 253)
	a, b := v1alpha1.NodeLeaseName(long), v1alpha1.NodeLeaseName(long[1:]+"m")
	if a == b || len(a) > 253 || len(validation.IsDNS1123Subdomain(a)) != 0 {
		t.Errorf("lease names of long node names: %q, %q", a, b)
	}
}
