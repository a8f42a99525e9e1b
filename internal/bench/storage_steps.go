package bench

import (
	"time"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
)

// A volume's create → Ready is three steps as a watcher of the volume and its replicas
// sees them: the operator placing it (its finalizer, then one replica per pool), the
// agents bringing every replica to Healthy (a file with fsync, the peers' list, a status
// write each), and the operator reporting the volume Ready. Timed one by one, they say
// which part of the critical path its ratio to the ideal comes from.

// StorageStep is one step of create → Ready, its p50 over the volumes measured.
type StorageStep struct {
	Name  string  `json:"name"`
	P50Ms float64 `json:"p50Ms"`
}

// Step names, in order.
const (
	stepPlaced  = "create → every replica created (operator: finalizer, placement)"
	stepHealthy = "→ every replica Healthy (agents: file, fsync, peer list, status)"
	stepReady   = "→ volume Ready (operator: volume status)"
)

// volumeTimes are when, after its create was sent, a volume's steps were seen done.
type volumeTimes struct {
	placed, healthy, ready time.Duration
}

// volumeSteps follows one volume's replicas and readiness on the creator's watches.
type volumeSteps struct {
	volume  string
	rf      int
	start   time.Time
	created map[string]bool
	healthy map[string]bool
	times   volumeTimes
}

func newVolumeSteps(volume string, rf int, start time.Time) *volumeSteps {
	return &volumeSteps{volume: volume, rf: rf, start: start, created: map[string]bool{}, healthy: map[string]bool{}}
}

// replica notes a replica event; those of other volumes are not this volume's.
func (s *volumeSteps) replica(r *storagev1alpha1.CStorVolumeReplica) {
	if r.Spec.Volume != s.volume {
		return
	}
	now := time.Since(s.start)
	s.created[r.Name] = true
	if len(s.created) >= s.rf && s.times.placed == 0 {
		s.times.placed = now
	}
	if r.Status.Phase == storagev1alpha1.ReplicaPhaseHealthy && r.Status.ObservedGeneration >= r.Generation {
		s.healthy[r.Name] = true
	}
	if len(s.healthy) >= s.rf && s.times.healthy == 0 {
		s.times.healthy = now
	}
}

// ready notes the volume's Ready. A step whose events the watch had not delivered yet
// (they arrive on another watch) counts as done when the next one is.
func (s *volumeSteps) ready(*storagev1alpha1.CStorVolume) {
	s.times.ready = time.Since(s.start)
	if s.times.healthy == 0 {
		s.times.healthy = s.times.ready
	}
	if s.times.placed == 0 {
		s.times.placed = s.times.healthy
	}
}

// storageSteps are the steps' p50s over the volumes.
func storageSteps(d []volumeTimes) []StorageStep {
	placed := make([]time.Duration, len(d))
	healthy := make([]time.Duration, len(d))
	ready := make([]time.Duration, len(d))
	for i, t := range d {
		placed[i], healthy[i], ready[i] = t.placed, t.healthy-t.placed, t.ready-t.healthy
	}
	return []StorageStep{
		{Name: stepPlaced, P50Ms: summarize(placed).P50},
		{Name: stepHealthy, P50Ms: summarize(healthy).P50},
		{Name: stepReady, P50Ms: summarize(ready).P50},
	}
}
