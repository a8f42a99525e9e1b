package agent

import (
	"bytes"
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/storage/replica"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// A restarted agent is not ready while a replica that a target writes misses the writes
// made while no agent served it: a DaemonSet's rollout would take the next node's agent
// down, and the volume would be short of quorum. It is ready once the target has taken the
// replica back in and the rebuild has ended.
func TestReadyOnceReplicasCaughtUp(t *testing.T) {
	ctx := t.Context()
	a := startAgent(t, "up", "1Gi", "4Mi")
	b := startAgentFor(t, a.ca, a.vol, "restarted", "1Gi")
	listReplicas(t, a.c, a.vol, a.r, b.r)
	a.ready("4Mi")
	b.ready("4Mi")

	// The test is the volume's target: a session on each replica, one write on both.
	first := bytes.Repeat([]byte("crdipc-first "), 4096)
	sa, sb := a.dial(t), b.dial(t)
	for _, s := range []*replica.Client{sa, sb} {
		if _, err := s.Open(ctx); err != nil {
			t.Fatal(err)
		}
		if err := s.WriteAt(ctx, first, 0, 1); err != nil {
			t.Fatal(err)
		}
	}
	wait.Eventually(t, 30*time.Second, "the agent ready with its replica in a session", func(context.Context) (bool, error) {
		return b.readyz() == nil, b.readyz()
	})

	// b's agent restarts: its session ends, and the target goes on without it.
	b.restart()
	missed := bytes.Repeat([]byte("crdipc-missed "), 4096)
	if err := sa.WriteAt(ctx, missed, 1<<20, 2); err != nil {
		t.Fatal(err)
	}
	wait.Eventually(t, 60*time.Second, "the restarted agent waiting for the target", func(context.Context) (bool, error) {
		err := b.readyz()
		if err == nil {
			t.Fatal("the restarted agent is ready while its replica misses a write")
		}
		if !strings.Contains(err.Error(), "waiting for the volume's target to take it back in") {
			return false, err
		}
		return true, nil
	})
	t.Logf("not ready: %v", b.readyz())

	// The target takes it back in: a new session, rebuilt from a. The readiness check saw the
	// replica's state before its status (with the restarted data service's endpoint) is
	// stored: the status is read once it is.
	wait.Eventually(t, 30*time.Second, "the restarted agent's status of the replica", func(ctx context.Context) (bool, error) {
		if err := b.c.Get(ctx, client.ObjectKeyFromObject(b.r), b.r); err != nil {
			return false, err
		}
		if b.r.Status.Phase != storagev1alpha1.ReplicaPhaseRebuilding {
			return false, fmt.Errorf("phase %q", b.r.Status.Phase)
		}
		return true, nil
	})
	sb = b.dial(t)
	if _, err := sb.Open(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.Rebuild(ctx, a.r.Status.Endpoint, storagev1alpha1.ReplicaDataID(a.r.Namespace, a.r.Name)); err != nil {
		t.Fatal(err)
	}
	wait.Eventually(t, 60*time.Second, "the restarted agent ready once rebuilt", func(ctx context.Context) (bool, error) {
		err := b.readyz()
		if err != nil {
			return false, err
		}
		in, err := sb.Info(ctx)
		if err != nil || in.Rebuilding {
			t.Fatalf("ready while the replica is rebuilding: %+v, %v", in, err)
		}
		return true, nil
	})
	holds(t, b.r, 1<<20, missed)
}

// The wait is bounded: a replica that never catches up (its source is gone) does not stop
// every later rollout. Before the bound, /readyz names it.
func TestReadyAfterTheCatchUpTimeout(t *testing.T) {
	r := &storagev1alpha1.CStorVolumeReplica{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "r", UID: "u"}, Spec: storagev1alpha1.CStorVolumeReplicaSpec{NodeName: "n1"}}
	c := &catchUp{node: "n1", cache: fakeClient(r), data: &dataServer{}, timeout: time.Minute, log: logr.Discard()}
	req := httptest.NewRequest("GET", "/readyz", nil)
	if err := c.check(req); err == nil || !strings.Contains(err.Error(), "node lease") {
		t.Fatalf("before the Lease: %v", err)
	}
	c.leading(time.Now())
	if err := c.check(req); err == nil || !strings.Contains(err.Error(), "ns/r: not checked since the agent started") {
		t.Fatalf("before the replica was reconciled: %v", err)
	}
	c.observe(r.UID, "")
	if err := c.check(req); err == nil || !strings.Contains(err.Error(), "could not be checked") {
		t.Fatalf("data service not asked: %v", err)
	}
	c.observe(r.UID, storagev1alpha1.ReplicaPhaseOffline)
	if err := c.check(req); err != nil {
		t.Fatalf("an Offline replica (no wait helps): %v", err)
	}
	c.observe(r.UID, "")
	c.leading(time.Now().Add(-2 * time.Minute))
	if err := c.check(req); err != nil {
		t.Fatalf("past the timeout: %v", err)
	}
	if !c.gaveUp {
		t.Fatal("ready past the timeout, but not remembered as given up")
	}
}
