package sidecar_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/csi/driver"
	"github.com/crdipc/crdipc/internal/csi/sidecar"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/simnode"
	"github.com/crdipc/crdipc/internal/testenv"
	testmetrics "github.com/crdipc/crdipc/internal/testenv/metrics"
	"github.com/crdipc/crdipc/internal/testenv/storagecluster"
)

func TestMain(m *testing.M) {
	testenv.Main(m)
}

// lines is a logger that keeps every line, debug ones included, for a test to read.
type lines struct {
	mu  sync.Mutex
	all []string
}

func (l *lines) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.all = append(l.all, prefix+" "+args)
	}, funcr.Options{Verbosity: 1})
}

// count is how many lines hold every one of parts.
func (l *lines) count(parts ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
next:
	for _, s := range l.all {
		for _, p := range parts {
			if !strings.Contains(s, p) {
				continue next
			}
		}
		n++
	}
	return n
}

// A claim no pool could ever hold — larger than every pool and every claim's pools, or
// past what a volume may be at all (16Ei, clamped to 2^63-1 bytes) — gets OutOfRange from
// the driver, one Warning ProvisioningFailed Event with the driver's message, and no further
// CreateVolume call until the claim changes; the volume the driver made is not left behind.
// Driver and sidecar run as their ServiceAccounts, over a real Unix socket.
// serveDriver serves the CSI driver with o, acting as its ServiceAccount, on a Unix socket of
// its own until the test ends, and returns the socket's endpoint.
func serveDriver(t *testing.T, env *testenv.Env, o driver.Options) string {
	t.Helper()
	o.Config = env.AsServiceAccount(t, "csi-driver")
	return storagecluster.ServeDriver(t, o)
}

func TestOutOfRangeIsNotRetried(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	cluster := storagecluster.Start(t, storagecluster.Options{Nodes: 1})
	claim := &storagev1alpha1.StoragePoolClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "sidecar"},
		Spec: storagev1alpha1.StoragePoolClaimSpec{MinPools: 1, Capacity: resource.MustParse("1Gi"), Backend: storagev1alpha1.BackendFile,
			NodeSelector: map[string]string{simnode.Label: "true"}},
	}
	cluster.PoolClaim(t, claim)
	testenv.Eventually(t, 30*time.Second, "a healthy pool", func(ctx context.Context) (bool, error) {
		var pools storagev1alpha1.CStorPoolList
		if err := env.Client.List(ctx, &pools); err != nil {
			return false, err
		}
		for _, p := range pools.Items {
			if p.Status.Phase == storagev1alpha1.PoolPhaseHealthy {
				return true, nil
			}
		}
		return false, fmt.Errorf("%d pools, none healthy", len(pools.Items))
	})

	reg := prometheus.NewRegistry()
	socket := serveDriver(t, env, driver.Options{Registerer: reg})

	log := &lines{}
	sm := testenv.NewManager(t, env.AsServiceAccount(t, "csi-sidecar"))
	logger := log.logger()
	// A short resync makes the library look at the failed claims again and again: each time
	// is a chance to call CreateVolume that the sidecar must not take.
	if err := sidecar.Add(sm, sidecar.Options{DriverEndpoint: socket, DriverName: driver.Name, CallTimeout: 5 * time.Second,
		BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second, Resync: 100 * time.Millisecond, Logger: &logger}); err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, "sidecar", sm.Start)
	sc := &storagev1.StorageClass{
		ObjectMeta:    metav1.ObjectMeta{Name: "out-of-range"},
		Provisioner:   driver.Name,
		Parameters:    map[string]string{driver.ParamReplicaCount: "1"},
		ReclaimPolicy: ptr.To(corev1.PersistentVolumeReclaimDelete),
	}
	if err := env.Client.Create(ctx, sc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), sc) })

	ns := env.Namespace(t)
	outOfRange := func() float64 {
		return testmetrics.Gather(t, reg).Sum("crdipc_csi_operations_seconds_count", map[string]string{"method": "CreateVolume", "grpc_status_code": "OutOfRange"})
	}
	calls := 0.0
	for _, tc := range []struct{ name, size, want string }{
		{name: "larger-than-any-pool", size: "2Gi", want: "no pool could ever hold a replica of 2Gi: the largest of 1 pool holds 1Gi"},
		{name: "past-any-volume", size: "16Ei", want: "capacity 9223372036854775807 bytes is unsupported"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pvc := &corev1.PersistentVolumeClaim{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: tc.name},
				Spec: corev1.PersistentVolumeClaimSpec{
					StorageClassName: ptr.To(sc.Name),
					AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(tc.size)}},
				},
			}
			if err := env.Client.Create(ctx, pvc); err != nil {
				t.Fatal(err)
			}
			failed := func(n int) {
				t.Helper()
				testenv.Eventually(t, 30*time.Second, fmt.Sprintf("%d Warning ProvisioningFailed Event(s) with OutOfRange", n), func(ctx context.Context) (bool, error) {
					var evs corev1.EventList
					if err := env.Client.List(ctx, &evs, client.InNamespace(ns),
						client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("involvedObject.uid", string(pvc.UID))}); err != nil {
						return false, err
					}
					got, seen := 0, []string{}
					for _, e := range evs.Items {
						if e.Type == corev1.EventTypeWarning && e.Reason == "ProvisioningFailed" &&
							strings.Contains(e.Message, "code = OutOfRange") && strings.Contains(e.Message, tc.want) {
							got += int(max(e.Count, 1))
						}
						seen = append(seen, e.Type+"/"+e.Reason+": "+e.Message)
					}
					if got != n {
						return false, fmt.Errorf("%d such Events; all: %s", got, strings.Join(seen, " | "))
					}
					return true, nil
				})
			}
			failed(1)
			calls++
			// The library looks at the claim again at every resync; the sidecar declines.
			name, namespace := fmt.Sprintf("%q", pvc.Name), fmt.Sprintf("%q", ns) // as funcr writes them
			testenv.Eventually(t, 10*time.Second, "the sidecar declining the unchanged claim 3 times", func(context.Context) (bool, error) {
				if n := log.count("not retrying a claim that failed for good", name, namespace); n < 3 {
					return false, fmt.Errorf("declined %d times", n)
				}
				return true, nil
			})
			if n := outOfRange(); n != calls {
				t.Fatalf("%v CreateVolume calls answered OutOfRange, want %v: the unchanged claim was retried", n, calls)
			}
			// The driver deleted the volume it made for the claim (no PV will ever name it).
			testenv.Eventually(t, 20*time.Second, "no CStorVolume left for the claim", func(ctx context.Context) (bool, error) {
				err := env.Client.Get(ctx, client.ObjectKey{Namespace: install.SystemNamespace, Name: "pvc-" + string(pvc.UID)}, &storagev1alpha1.CStorVolume{})
				if !apierrors.IsNotFound(err) {
					return false, fmt.Errorf("get: %v", err)
				}
				return true, nil
			})

			// A changed claim is tried again, once.
			if err := env.Client.Patch(ctx, pvc, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"touched":"yes"}}}`))); err != nil {
				t.Fatal(err)
			}
			failed(2)
			calls++
			if n := outOfRange(); n != calls {
				t.Fatalf("%v CreateVolume calls answered OutOfRange, want %v", n, calls)
			}
			var pvs corev1.PersistentVolumeList
			if err := env.Client.List(ctx, &pvs); err != nil || len(pvs.Items) != 0 {
				t.Fatalf("PVs: %d, %v; want none", len(pvs.Items), err)
			}
		})
	}
}
