package agent

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/storage/replica"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// The agent deletes a replica's snapshot copies whose CStorVolumeSnapshot is gone — deleted
// directly, not through the CSI driver — and keeps those whose snapshot exists.
func TestCopiesOfDeletedSnapshotsGo(t *testing.T) {
	ctx := t.Context()
	a := startAgent(t, "orphans", "1Gi", "4Mi")
	a.ready("4Mi")
	session := a.dial(t)
	if _, err := session.Open(ctx); err != nil {
		t.Fatal(err)
	}
	if err := session.WriteAt(ctx, make([]byte, 4096), 0, 1); err != nil {
		t.Fatal(err)
	}
	snap := func(name string) *storagev1alpha1.CStorVolumeSnapshot {
		s := &storagev1alpha1.CStorVolumeSnapshot{
			ObjectMeta: metav1.ObjectMeta{Namespace: a.r.Namespace, Name: name},
			Spec:       storagev1alpha1.CStorVolumeSnapshotSpec{Volume: "vol"},
		}
		if err := a.c.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		// As the driver does: the object first, then the copy named after its UID.
		if _, err := session.Snapshot(ctx, string(s.UID)); err != nil {
			t.Fatalf("copy of %s: %v", name, err)
		}
		return s
	}
	kept, gone := snap("kept"), snap("gone")
	if err := session.CloseSession(ctx); err != nil {
		t.Fatal(err)
	}
	copies := func() []string {
		t.Helper()
		names, err := replica.SnapshotNames(a.r.Status.Location)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(names)
		return names
	}
	if got := copies(); len(got) != 2 {
		t.Fatalf("copies after taking two: %v", got)
	}
	if err := a.c.Delete(ctx, gone); err != nil {
		t.Fatal(err)
	}
	// The pass that drops the one copy has found the other's snapshot and kept it.
	wait.Eventually(t, 30*time.Second, "the copy of the deleted snapshot gone, the other kept", func(context.Context) (bool, error) {
		got := copies()
		if !slices.Equal(got, []string{string(kept.UID)}) {
			return false, fmt.Errorf("copies %v; want only %s (kept), not %s (gone)", got, kept.UID, gone.UID)
		}
		return true, nil
	})
	_ = a.c.Delete(context.Background(), kept)
}
