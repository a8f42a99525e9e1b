package v1alpha1_test

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/crdipc/crdipc/api/storage/v1alpha1"
)

func TestPoolAndReplicaNames(t *testing.T) {
	pool := v1alpha1.PoolName("sample-claim", "node-1")
	if !strings.HasPrefix(pool, "sample-claim-node-1-") || len(pool) != len("sample-claim-node-1-")+10 {
		t.Errorf("PoolName = %q, want sample-claim-node-1-<10 hex digits>", pool)
	}
	if got := v1alpha1.ReplicaName("vol", pool); !strings.HasPrefix(got, "vol-"+pool+"-") {
		t.Errorf("ReplicaName = %q, want vol-%s-<hash>", got, pool)
	}
	if pool != v1alpha1.PoolName("sample-claim", "node-1") {
		t.Error("PoolName is not deterministic")
	}
	long := strings.Repeat("a", 60)
	all := map[string]string{}
	check := func(what, n string) {
		t.Helper()
		if len(n) > v1alpha1.MaxGeneratedNameLength {
			t.Errorf("%s: %q is %d long", what, n, len(n))
		}
		if errs := validation.IsDNS1123Label(n); len(errs) > 0 {
			t.Errorf("%s: %q: %v", what, n, errs)
		}
		if other, ok := all[n]; ok {
			t.Errorf("%s and %s share the name %q", what, other, n)
		}
		all[n] = what
	}
	// Parts that read alike once joined with "-", or once cut to fit, get distinct names.
	for _, p := range [][2]string{
		{"a-b", "c"}, {"a", "b-c"}, {"a-b-c", ""}, {"", "a-b-c"},
		{"claim", "node.example.com"}, {"claim", "node-example-com"}, {"claim-node", "example.com"},
		{long, "node-1"}, {long, "node-2"}, {long + "x", "node-1"},
		{strings.Repeat("c.", 40), "node.example.com"}, {strings.Repeat("v", 51) + ".xxxxxxxx", "pool"},
		{strings.Repeat("-", 70), "n"},
	} {
		check(fmt.Sprintf("PoolName(%q, %q)", p[0], p[1]), v1alpha1.PoolName(p[0], p[1]))
	}
	// The collision of the old scheme ("<claim>-<node>", and "<volume>-<pool>").
	if v1alpha1.PoolName("a-b", "c") == v1alpha1.PoolName("a", "b-c") || v1alpha1.ReplicaName("v-p", "1") == v1alpha1.ReplicaName("v", "p-1") {
		t.Error("names of different parts collide")
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
