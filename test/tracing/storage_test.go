package tracing

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/testenv/storagecluster"
	"github.com/crdipc/crdipc/internal/tracing"
	"github.com/crdipc/crdipc/ipc"
)

const (
	operatorService = "storage-operator"
	agentService    = "pool-agent"
)

// TestStorageRequestIsOneTrace runs both kinds of storage request on one storage cluster
// (three simulated nodes with a pool each): a CStorVolume sent with Call, and a claim that
// the CSI sidecar and driver turn into one.
func TestStorageRequestIsOneTrace(t *testing.T) {
	cluster := storagecluster.Start(t, storagecluster.Options{Nodes: 3, Tracing: provider, Tokens: true})
	cluster.PoolClaim(t, &storagev1alpha1.StoragePoolClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "traced"},
		Spec: storagev1alpha1.StoragePoolClaimSpec{
			PoolType: storagev1alpha1.PoolTypeStriped, Backend: storagev1alpha1.BackendFile,
			MinPools: 3, MaxPools: ptr.To[int32](3), Capacity: resource.MustParse("1Gi"),
		},
	})
	t.Run("CStorVolume", testVolumeTrace)
	t.Run("PersistentVolumeClaim", testClaimTrace)
}

// testVolumeTrace: a CStorVolume requested with Call is one trace, in which the operator's
// reconciles continue the call, every replica's agent continues the operator reconcile that
// created the replica, and kube-apiserver's spans of the agents' status writes (an agent
// acts with a token of its node's ServiceAccount, as in up) sit under them.
func testVolumeTrace(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	sender, err := client.NewWithWatch(provider.RESTConfig(env.Config, senderService), client.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	vol := &storagev1alpha1.CStorVolume{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "traced"},
		Spec:       storagev1alpha1.CStorVolumeSpec{Capacity: resource.MustParse("16Mi"), ReplicationFactor: 3},
	}
	t.Cleanup(func() {
		if err := env.Client.Delete(context.Background(), vol); client.IgnoreNotFound(err) != nil {
			t.Errorf("deleting volume: %v", err)
		}
		testenv.Eventually(t, time.Minute, "the volume gone", func(ctx context.Context) (bool, error) {
			err := env.Client.Get(ctx, client.ObjectKeyFromObject(vol), &storagev1alpha1.CStorVolume{})
			return err != nil, client.IgnoreNotFound(err)
		})
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := ipc.Call(ctx, sender, vol, ipc.Ready, ipc.WithTracerProvider(provider.Service(senderService))); err != nil {
		t.Fatalf("call: %v", err)
	}
	call := traceparentOf(t, vol)

	names := replicasOf(t, vol)

	tr := waitTrace(t, call.TraceID(), "the operator's and every agent's spans in the call's trace", func(tr traceSpans) error {
		return volumeTraced(tr, call.SpanID(), names)
	})
	tr.log(t)
}

// replicasOf names vol's replicas, which must be 3.
func replicasOf(t *testing.T, vol *storagev1alpha1.CStorVolume) []string {
	t.Helper()
	var replicas storagev1alpha1.CStorVolumeReplicaList
	if err := testenv.Get(t).Client.List(context.Background(), &replicas, client.InNamespace(vol.Namespace)); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range replicas.Items {
		if metav1.IsControlledBy(&r, vol) {
			names = append(names, r.Name)
		}
	}
	if len(names) != 3 {
		t.Fatalf("volume has replicas %v, want 3", names)
	}
	return names
}

// volumeTraced checks the part of a trace that a volume's request caused: the operator's
// reconciles children of the span that stored the volume (parent), and for each replica
// an agent's reconcile, child of the operator's handle span that created it, with
// kube-apiserver's span of an agent's status write under the agent's span.
func volumeTraced(tr traceSpans, parent trace.SpanID, replicas []string) error {
	reconciles := tr.of(operatorService, "reconcile CStorVolume")
	if len(reconciles) == 0 {
		return errors.New("no reconcile span from the operator")
	}
	for _, r := range reconciles {
		if r.Parent != parent {
			return fmt.Errorf("operator span %s: want span %s, from the volume's annotation, as its parent", r, parent)
		}
	}
	handles := map[trace.SpanID]bool{}
	for _, h := range tr.of(operatorService, "handle CStorVolume") {
		handles[h.SpanID] = true
	}
	for _, name := range replicas {
		found := filter(tr.of(agentService, "reconcile CStorVolumeReplica"), func(s span) bool { return s.Attributes["ipc.name"] == name })
		if len(found) == 0 {
			return fmt.Errorf("no agent reconcile span for replica %s", name)
		}
		for _, s := range found {
			if !handles[s.Parent] {
				return fmt.Errorf("agent span %s: want the operator's handle span that created the replica as its parent", s)
			}
		}
	}
	if len(tr.of(agentService, "queue wait")) == 0 {
		return errors.New("no queue wait span from the agents")
	}
	for _, w := range tr.of(agentService, "write status") {
		if _, ok := findFunc(tr.all, func(s span) bool {
			return s.Service == tracing.APIServerService && strings.HasSuffix(s.Name, "/cstorvolumereplicas/{:name}/status") && tr.under(s, w.SpanID)
		}); ok {
			return nil
		}
	}
	return errors.New("no kube-apiserver span of an agent's status write under the agent's")
}
