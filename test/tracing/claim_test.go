package tracing

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/ptrace"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/csi/driver"
	"github.com/crdipc/crdipc/internal/csi/sidecar"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/testenv/storagecluster"
)

const (
	sidecarService = "csi-sidecar"
	driverService  = "csi-driver"
	createVolume   = "csi.v1.Controller/CreateVolume"
)

// testClaimTrace: a claim provisioned by the CSI sidecar is one trace: the sidecar's span of
// the provisioning, its CreateVolume call, the driver's span of serving it, which the
// driver stores on the CStorVolume it creates, and from there the operator's and the
// agents' spans as for a volume sent with Call.
func testClaimTrace(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	socket := storagecluster.ServeDriver(t, driver.Options{
		Config:         provider.RESTConfig(env.WithToken(t, env.AsServiceAccount(t, driverService)), driverService),
		TracerProvider: provider.Service(driverService),
	})
	sm := testenv.NewManager(t, provider.RESTConfig(env.WithToken(t, env.AsServiceAccount(t, sidecarService)), sidecarService))
	if err := sidecar.Add(sm, sidecar.Options{DriverEndpoint: socket, DriverName: driver.Name, TracerProvider: provider.Service(sidecarService)}); err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, "csi sidecar", sm.Start)

	class := &storagev1.StorageClass{
		ObjectMeta:    metav1.ObjectMeta{Name: "traced"},
		Provisioner:   driver.Name,
		Parameters:    map[string]string{driver.ParamReplicaCount: "3"},
		ReclaimPolicy: ptr.To(corev1.PersistentVolumeReclaimDelete),
	}
	if err := env.Client.Create(context.Background(), class); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), class) })
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "traced"},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &class.Name,
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("16Mi")}},
		},
	}
	if err := env.Client.Create(context.Background(), pvc); err != nil {
		t.Fatal(err)
	}
	// Before the sidecar and driver stop (cleanups run last first): the released volume is
	// deleted, so that the pools can go.
	var pv corev1.PersistentVolume
	t.Cleanup(func() {
		if err := env.Client.Delete(context.Background(), pvc); client.IgnoreNotFound(err) != nil {
			t.Errorf("deleting claim: %v", err)
		}
		testenv.Eventually(t, time.Minute, "the claim's volume deleted", func(ctx context.Context) (bool, error) {
			if pv.Spec.CSI == nil {
				return true, nil
			}
			err := env.Client.Get(ctx, client.ObjectKey{Namespace: install.SystemNamespace, Name: pv.Spec.CSI.VolumeHandle}, &storagev1alpha1.CStorVolume{})
			return err != nil, client.IgnoreNotFound(err)
		})
	})
	testenv.Eventually(t, time.Minute, "the claim bound", func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pvc), pvc); err != nil {
			return false, err
		}
		if pvc.Status.Phase != corev1.ClaimBound {
			return false, fmt.Errorf("claim %s", pvc.Status.Phase)
		}
		return true, env.Client.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, &pv)
	})
	vol := &storagev1alpha1.CStorVolume{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: install.SystemNamespace, Name: pv.Spec.CSI.VolumeHandle}, vol); err != nil {
		t.Fatal(err)
	}
	served := traceparentOf(t, vol)
	names := replicasOf(t, vol)

	tr := waitTrace(t, served.TraceID(), "the sidecar's, driver's, operator's and every agent's spans in the claim's trace", func(tr traceSpans) error {
		provisions := tr.of(sidecarService, "provision PersistentVolumeClaim")
		if len(provisions) == 0 {
			return errors.New("no provisioning span from the sidecar")
		}
		p := provisions[0]
		if p.Parent.IsValid() || p.Attributes["ipc.name"] != pvc.Name {
			return fmt.Errorf("provisioning span %s %v: want a root span naming claim %s", p, p.Attributes, pvc.Name)
		}
		server, ok := tr.byID[served.SpanID()]
		if !ok || server.Service != driverService || server.Name != createVolume || server.Kind != ptrace.SpanKindServer {
			return fmt.Errorf("the volume names span %s: want the driver's server span of %s (%v)", served.SpanID(), createVolume, server)
		}
		call, ok := tr.byID[server.Parent]
		if !ok || call.Service != sidecarService || call.Name != createVolume || call.Kind != ptrace.SpanKindClient || call.Parent != p.SpanID {
			return fmt.Errorf("driver span's parent %v: want the sidecar's client span of %s, under the provisioning span", call, createVolume)
		}
		return volumeTraced(tr, served.SpanID(), names)
	})
	tr.log(t)
}
