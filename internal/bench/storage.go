package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/scheme"
)

// StorageOptions sizes the storage benchmark.
type StorageOptions struct {
	Floor FloorOptions
	// Volumes is how many volumes are created one after the other for the latency.
	Volumes int
	// ThroughputVolumes are created by Creators concurrent creators for the throughput.
	ThroughputVolumes, Creators int
	// ReplicationFactor of every volume.
	ReplicationFactor int32
	// VolumeSize of every volume; replicas are sparse, so it costs no disk.
	VolumeSize resource.Quantity
	// ClaimName is the StoragePoolClaim the benchmark creates when the cluster has fewer
	// Healthy pools than ReplicationFactor (and deletes at the end).
	ClaimName string
	// InProcess says the API server runs in this process (the embedded control plane):
	// its request counter is read from this process's registry, not from its /metrics.
	InProcess bool
}

// DefaultStorageOptions take ~30 s on a 2-core machine.
var DefaultStorageOptions = StorageOptions{
	Floor:   FloorOptions{Writers: []int{1, 8}, Creates: 500, Samples: 100},
	Volumes: 100, ThroughputVolumes: 200, Creators: 8,
	ReplicationFactor: 3, VolumeSize: resource.MustParse("1Mi"),
	ClaimName: "crdipc-bench",
}

// Storage is the storage system of seed 000 measured end to end, operator and node
// agents included, next to the floor of the same run.
type Storage struct {
	Floor             *Floor `json:"floor"`
	ReplicationFactor int32  `json:"replicationFactor"`
	Pools             int    `json:"healthyPools"`
	// CreateToReady is one creator's CStorVolume create → its Ready=True arriving on the
	// creator's watch, volumes created one after the other.
	CreateToReady Latencies `json:"createToReady"`
	// Steps divide CreateToReady as the creator's watches of the volume and its replicas
	// saw it, each step's p50.
	Steps []StorageStep `json:"steps,omitempty"`
	// VolumesPerSec: Ready volumes per second with Creators concurrent creators.
	VolumesPerSec float64 `json:"volumesPerSec"`
	Creators      int     `json:"creators"`
	// WritesPerVolume is the writes to volumes and replicas per volume, counted by the API
	// server over the volumes of CreateToReady (APIRequests).
	WritesPerVolume float64 `json:"writesPerVolume"`
	// IdealWrites is what a volume needs at least: 1+RF creates and RF+1 status
	// writes (each replica's Healthy, the volume's Ready).
	IdealWrites int `json:"idealWrites"`
	// IdealLatencyMs is the critical path if the API server were the only cost: four
	// writes one after the other, each seen through a watch (volume create, replica
	// create, replica status, volume status), at the floor's create→watch p50.
	IdealLatencyMs float64 `json:"idealLatencyMs"`
	// IdealVolumesPerSec is the floor's creates/s with Creators writers divided by
	// IdealWrites.
	IdealVolumesPerSec float64 `json:"idealVolumesPerSec"`
	// Ratios to the ideal: latency p50 over IdealLatencyMs, IdealVolumesPerSec over
	// VolumesPerSec, WritesPerVolume over IdealWrites (1 = ideal; the goal is ≤ 2).
	P50Ratio        float64 `json:"p50Ratio"`
	ThroughputRatio float64 `json:"throughputRatio"`
	WritesRatio     float64 `json:"writesRatio"`
	// APIRequests are what one volume costs the API server, from its create to the last
	// write the operator and agents make for it, counted over the volumes of CreateToReady,
	// created one after the other (nothing else loads the API server then).
	APIRequests *APIRequests `json:"apiRequestsPerVolume,omitempty"`
}

// storagePath is what a volume touches: the volume, its replicas, their pools, Events.
var storagePath = pathOf(storagev1alpha1.GroupVersion.Group)

// volumeResources are the objects IdealWrites counts the writes to.
var volumeResources = []schema.GroupResource{
	{Group: storagev1alpha1.GroupVersion.Group, Resource: "cstorvolumes"},
	{Group: storagev1alpha1.GroupVersion.Group, Resource: "cstorvolumereplicas"},
}

// MeasureStorage measures the floor, then CStorVolumes through the operator and node
// agents already running against cfg (crdipc up, or what bench storage starts).
func MeasureStorage(ctx context.Context, cfg *rest.Config, o StorageOptions) (*Storage, error) {
	floor, err := MeasureFloor(ctx, cfg, o.Floor)
	if err != nil {
		return nil, err
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		return nil, fmt.Errorf("creating client: %w", err)
	}
	pools, cleanupClaim, err := ensurePools(ctx, c, o)
	if err != nil {
		return nil, err
	}
	defer cleanupClaim()
	ns, cleanup, err := tempNamespace(ctx, c, "bench-storage-")
	if err != nil {
		return nil, err
	}
	defer func() {
		// Volumes first, and wait for them (their finalizer waits for the agents to delete
		// the replicas' files), so that nothing is left on the nodes of a long-lived
		// cluster and no Event is refused by a terminating namespace.
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_ = c.DeleteAllOf(cctx, &storagev1alpha1.CStorVolume{}, client.InNamespace(ns))
		_ = wait.PollUntilContextCancel(cctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			var list storagev1alpha1.CStorVolumeList
			err := c.List(ctx, &list, client.InNamespace(ns), client.Limit(1))
			return err == nil && len(list.Items) == 0, nil
		})
		cleanup()
	}()

	s := &Storage{Floor: floor, ReplicationFactor: o.ReplicationFactor, Pools: pools, Creators: o.Creators}
	counter, err := newRequestCounter(cfg, o.InProcess)
	if err != nil {
		return nil, err
	}
	if s.CreateToReady, s.Steps, s.APIRequests, err = volumeLatency(ctx, c, counter, ns, o); err != nil {
		return nil, err
	}
	// Counted by the API server rather than on watches (as it was): a watch sees only the
	// writes that changed an object, not a conflict or a no-op update, and the watch of
	// every replica cost the API server during the throughput run it measured.
	s.WritesPerVolume = s.APIRequests.writesTo(volumeResources...)
	if s.VolumesPerSec, err = volumeThroughput(ctx, cfg, c, ns, o); err != nil {
		return nil, err
	}
	rf := int(o.ReplicationFactor)
	s.IdealWrites = 1 + rf + rf + 1
	s.IdealLatencyMs = 4 * floor.CreateToWatch.P50
	s.IdealVolumesPerSec = floor.CreatesPerSec[o.Creators] / float64(s.IdealWrites)
	if s.IdealLatencyMs > 0 {
		s.P50Ratio = s.CreateToReady.P50 / s.IdealLatencyMs
	}
	if s.VolumesPerSec > 0 {
		s.ThroughputRatio = s.IdealVolumesPerSec / s.VolumesPerSec
	}
	s.WritesRatio = s.WritesPerVolume / float64(s.IdealWrites)
	return s, nil
}

// ensurePools waits for ReplicationFactor Healthy pools, creating a claim for them if
// the cluster has too few.
func ensurePools(ctx context.Context, c client.Client, o StorageOptions) (int, func(), error) {
	healthy := func(ctx context.Context) (int, error) {
		var list storagev1alpha1.CStorPoolList
		if err := c.List(ctx, &list); err != nil {
			return 0, err
		}
		n := 0
		for _, p := range list.Items {
			if p.Status.Phase == storagev1alpha1.PoolPhaseHealthy && p.DeletionTimestamp.IsZero() {
				n++
			}
		}
		return n, nil
	}
	n, err := healthy(ctx)
	if err != nil {
		return 0, nil, fmt.Errorf("listing pools: %w", err)
	}
	cleanup := func() {}
	if n < int(o.ReplicationFactor) {
		claim := &storagev1alpha1.StoragePoolClaim{
			ObjectMeta: metav1.ObjectMeta{Name: o.ClaimName},
			Spec:       storagev1alpha1.StoragePoolClaimSpec{MinPools: 1, Capacity: resource.MustParse("100Gi"), Backend: storagev1alpha1.BackendFile},
		}
		if err := c.Create(ctx, claim); err != nil && !apierrors.IsAlreadyExists(err) {
			return 0, nil, fmt.Errorf("creating claim: %w", err)
		}
		// Deleted at the end; the operator removes its pools once they are empty.
		cleanup = func() { _ = c.Delete(context.Background(), claim) }
	}
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err = healthy(ctx)
		return n >= int(o.ReplicationFactor), err
	})
	if err != nil {
		cleanup()
		return 0, nil, fmt.Errorf("waiting for %d Healthy pools (have %d; are the operator and pool agents running?): %w", o.ReplicationFactor, n, err)
	}
	return n, cleanup, nil
}

func newVolume(ns, name string, o StorageOptions) *storagev1alpha1.CStorVolume {
	return &storagev1alpha1.CStorVolume{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{benchLabel: "storage"}},
		Spec:       storagev1alpha1.CStorVolumeSpec{Capacity: o.VolumeSize, ReplicationFactor: o.ReplicationFactor},
	}
}

func volumeReady(v *storagev1alpha1.CStorVolume) bool {
	c := meta.FindStatusCondition(v.Status.Conditions, conditions.TypeReady)
	return c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration >= v.Generation && v.Status.ObservedGeneration >= v.Generation
}

// volumeLatency creates volumes one at a time and times each until it is Ready, step by
// step, and counts the API requests they cost. The count starts once the watches are set
// up and ends before they stop, so that the bench's own requests are not in it.
func volumeLatency(ctx context.Context, c client.WithWatch, counter *requestCounter, ns string, o StorageOptions) (Latencies, []StorageStep, *APIRequests, error) {
	vw, err := watchFromNow(ctx, c, &storagev1alpha1.CStorVolumeList{}, ns)
	if err != nil {
		return Latencies{}, nil, nil, err
	}
	defer vw.Stop()
	rw, err := watchFromNow(ctx, c, &storagev1alpha1.CStorVolumeReplicaList{}, ns)
	if err != nil {
		return Latencies{}, nil, nil, err
	}
	defer rw.Stop()
	var d []volumeTimes
	api, err := countRequests(ctx, counter, storagePath, fmt.Sprintf("%d volumes one after the other", o.Volumes), o.Volumes, func() (err error) {
		d, err = createVolumesOneByOne(ctx, c, vw, rw, ns, o)
		return err
	})
	if err != nil {
		return Latencies{}, nil, nil, err
	}
	total := make([]time.Duration, len(d))
	for i, t := range d {
		total[i] = t.ready
	}
	return summarize(total), storageSteps(d), api, nil
}

// createVolumesOneByOne creates o.Volumes volumes, each once the one before is Ready, and
// returns when each step of each was seen; vw watches the volumes of ns, rw their replicas.
func createVolumesOneByOne(ctx context.Context, c client.Client, vw, rw watch.Interface, ns string, o StorageOptions) ([]volumeTimes, error) {
	d := make([]volumeTimes, 0, o.Volumes)
	for i := range o.Volumes {
		name := fmt.Sprintf("lat-%d", i)
		vctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		t := time.Now()
		if err := c.Create(vctx, newVolume(ns, name, o)); err != nil {
			cancel()
			return nil, fmt.Errorf("create: %w", err)
		}
		seen := newVolumeSteps(name, int(o.ReplicationFactor), t)
		err := func() error {
			for {
				select {
				case <-vctx.Done():
					return fmt.Errorf("volume %s not Ready: %w", name, vctx.Err())
				case ev, open := <-rw.ResultChan():
					if !open {
						return errors.New("replica watch closed")
					}
					if r, ok := ev.Object.(*storagev1alpha1.CStorVolumeReplica); ok {
						seen.replica(r)
					}
				case ev, open := <-vw.ResultChan():
					if !open {
						return errors.New("watch closed")
					}
					if v, ok := ev.Object.(*storagev1alpha1.CStorVolume); ok && v.Name == name && volumeReady(v) {
						seen.ready(v)
						return nil
					}
				}
			}
		}()
		cancel()
		if err != nil {
			return nil, err
		}
		d = append(d, seen.times)
	}
	return d, nil
}

// volumeThroughput creates volumes from o.Creators goroutines, each with its own client,
// and measures Ready volumes per second.
func volumeThroughput(ctx context.Context, cfg *rest.Config, c client.WithWatch, ns string, o StorageOptions) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	vw, err := watchFromNow(ctx, c, &storagev1alpha1.CStorVolumeList{}, ns)
	if err != nil {
		return 0, err
	}
	defer vw.Stop()
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for range o.Creators {
		cc, err := client.New(rest.CopyConfig(cfg), client.Options{Scheme: scheme.Scheme})
		if err != nil {
			return 0, fmt.Errorf("creating client: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				j := next.Add(1)
				if j > int64(o.ThroughputVolumes) {
					return
				}
				if err := cc.Create(ctx, newVolume(ns, fmt.Sprintf("tp-%d", j), o)); err != nil {
					once.Do(func() { firstErr = fmt.Errorf("create: %w", err) })
					cancel()
					return
				}
			}
		}()
	}
	ready := map[string]bool{}
	for len(ready) < o.ThroughputVolumes {
		select {
		case <-ctx.Done():
			wg.Wait()
			if firstErr != nil {
				return 0, firstErr
			}
			return 0, fmt.Errorf("%d of %d volumes Ready: %w", len(ready), o.ThroughputVolumes, ctx.Err())
		case ev, open := <-vw.ResultChan():
			if !open {
				return 0, errors.New("watch closed")
			}
			if v, ok := ev.Object.(*storagev1alpha1.CStorVolume); ok && volumeReady(v) {
				ready[v.Name] = true
			}
		}
	}
	elapsed := time.Since(start)
	wg.Wait()
	return float64(o.ThroughputVolumes) / elapsed.Seconds(), nil
}
