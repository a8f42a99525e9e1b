package e2e_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/csi/driver"
	"github.com/crdipc/crdipc/internal/csi/sidecar"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/storage/agent"
	"github.com/crdipc/crdipc/internal/storage/operator"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/ipc"
)

func TestMain(m *testing.M) {
	testenv.Main(m)
}

const (
	driverSA  = "system:serviceaccount:" + install.SystemNamespace + ":crdipc-csi-driver"
	sidecarSA = "system:serviceaccount:" + install.SystemNamespace + ":crdipc-csi-sidecar"
	class     = "crdipc-test"
	mib       = 1 << 20
)

// world is the system under test: storage operator + simulated nodes, the driver on a Unix
// socket and the sidecar, the last two running as their ServiceAccounts with the shipped RBAC.
type world struct {
	t      *testing.T
	env    *testenv.Env
	c      client.WithWatch
	root   string
	socket string
	ns     string

	stopDriver func()
}

// TestCSI runs the scenarios in order on one world: they share nodes (a node joins in the
// second one and stays), and the sanity suite, which ginkgo runs once per process, comes last.
func TestCSI(t *testing.T) {
	w := newWorld(t)
	t.Run("RBAC", w.testRBAC)
	t.Run("ProvisionWaitsForNode", w.testProvisionWaitsForNode)
	t.Run("DriverRestartMidCreate", w.testDriverRestart)
	t.Run("ProvisionAttachDelete", w.testLifecycle)
	t.Run("Sanity", w.testSanity)
}

func newWorld(t *testing.T) *world {
	env := testenv.Get(t)
	sock, err := os.MkdirTemp("", "csi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(sock) })
	w := &world{t: t, env: env, c: env.Client, root: t.TempDir(), socket: "unix://" + filepath.Join(sock, "csi.sock"), ns: env.Namespace(t)}
	// The driver and sidecar run as their ServiceAccounts (see impersonate).
	env.AsServiceAccount(t, "csi-driver")
	env.AsServiceAccount(t, "csi-sidecar")

	// Storage: the operator and 2 simulated nodes with a file pool each.
	mgr := newManager(t, env.Config)
	if err := operator.Register(mgr, operator.Options{Receiver: ipc.Options{LeaseDuration: -1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := agent.AddSupervisor(mgr, env.Config, agent.SupervisorOptions{Nodes: 2, Root: w.root, Agent: agent.Options{Resync: 300 * time.Millisecond}}); err != nil {
		t.Fatal(err)
	}
	start(t, "storage", mgr.Start)
	claim := &storagev1alpha1.StoragePoolClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "csi"},
		Spec: storagev1alpha1.StoragePoolClaimSpec{
			MinPools: 1, Capacity: resource.MustParse("10Gi"), Backend: storagev1alpha1.BackendFile,
			NodeSelector: map[string]string{agent.SimulatedLabel: "true"},
		},
	}
	if err := w.c.Create(context.Background(), claim); err != nil {
		t.Fatal(err)
	}
	w.waitHealthyPools(2)

	w.startDriver()
	sm := newManager(t, impersonate(env.Config, sidecarSA))
	if err := sidecar.Add(sm, sidecar.Options{DriverEndpoint: w.socket, CallTimeout: 2 * time.Second, BackoffBase: 200 * time.Millisecond, BackoffMax: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	start(t, "sidecar", sm.Start)

	sc := &storagev1.StorageClass{
		ObjectMeta:    metav1.ObjectMeta{Name: class},
		Provisioner:   driver.Name,
		Parameters:    map[string]string{driver.ParamReplicaCount: "3"},
		ReclaimPolicy: ptr.To(corev1.PersistentVolumeReclaimDelete),
	}
	if err := w.c.Create(context.Background(), sc); err != nil {
		t.Fatal(err)
	}
	return w
}

// startDriver runs the driver as its ServiceAccount on w.socket, serving node-1.
func (w *world) startDriver() {
	d, err := driver.New(driver.Options{Config: impersonate(w.env.Config, driverSA), NodeID: "node-1", Root: filepath.Join(w.root, "node-1")})
	if err != nil {
		w.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	l, err := driver.Listen(w.socket)
	if err != nil {
		w.t.Fatal(err)
	}
	go func() {
		defer close(done)
		if err := d.ServeListener(ctx, l); err != nil {
			w.t.Errorf("driver: %v", err)
		}
	}()
	w.stopDriver = func() { cancel(); <-done }
	w.t.Cleanup(func() { w.stopDriver() })
}

func impersonate(cfg *rest.Config, user string) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Impersonate = rest.ImpersonationConfig{UserName: user}
	return c
}

func newManager(t *testing.T, cfg *rest.Config) manager.Manager {
	t.Helper()
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	return mgr
}

func start(t *testing.T, name string, run func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := run(ctx); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// eventually polls cond until it holds or the deadline passes; desc says what was last seen.
func (w *world) eventually(t *testing.T, what string, timeout time.Duration, cond func(ctx context.Context) (bool, string, error)) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		ok, desc, err := cond(ctx)
		last = desc
		return ok, err
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v; last seen: %s", what, err, last)
	}
}

func (w *world) waitHealthyPools(n int) {
	w.eventually(w.t, fmt.Sprintf("%d healthy pools", n), 30*time.Second, func(ctx context.Context) (bool, string, error) {
		var pools storagev1alpha1.CStorPoolList
		if err := w.c.List(ctx, &pools); err != nil {
			return false, "", err
		}
		healthy := 0
		for _, p := range pools.Items {
			if p.Status.Phase == storagev1alpha1.PoolPhaseHealthy {
				healthy++
			}
		}
		return healthy >= n, fmt.Sprintf("%d healthy of %d", healthy, len(pools.Items)), nil
	})
}

// addNode adds a simulated node, as `kubectl apply` of a labelled Node would.
func (w *world) addNode(name string, healthyPools int) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{agent.SimulatedLabel: "true"}}}
	if err := w.c.Create(context.Background(), n); err != nil {
		w.t.Fatal(err)
	}
	w.waitHealthyPools(healthyPools)
}

func (w *world) createPVC(t *testing.T, name string) *corev1.PersistentVolumeClaim {
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: ptr.To(class),
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("8Mi")}},
		},
	}
	if err := w.c.Create(context.Background(), pvc); err != nil {
		t.Fatal(err)
	}
	return pvc
}

func (w *world) waitBound(t *testing.T, pvc *corev1.PersistentVolumeClaim, timeout time.Duration) {
	w.eventually(t, "PVC "+pvc.Name+" Bound", timeout, func(ctx context.Context) (bool, string, error) {
		if err := w.c.Get(ctx, client.ObjectKeyFromObject(pvc), pvc); err != nil {
			return false, "", err
		}
		return pvc.Status.Phase == corev1.ClaimBound, string(pvc.Status.Phase), nil
	})
}

// replicaFiles are the replica files of volume on every node.
func (w *world) replicaFiles(volume string) []string {
	files, err := filepath.Glob(filepath.Join(w.root, "*", "pools", "*", install.SystemNamespace, volume+"-*.img"))
	if err != nil {
		w.t.Fatal(err)
	}
	return files
}

func (w *world) events(ctx context.Context, obj client.Object) ([]corev1.Event, error) {
	var evs corev1.EventList
	err := w.c.List(ctx, &evs, client.InNamespace(obj.GetNamespace()),
		client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("involvedObject.uid", string(obj.GetUID()))})
	return evs.Items, err
}

// testRBAC: each side can do its job and nothing of the other's.
func (w *world) testRBAC(t *testing.T) {
	ctx := context.Background()
	dc, err := client.New(impersonate(w.env.Config, driverSA), client.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := client.New(impersonate(w.env.Config, sidecarSA), client.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	type check struct {
		who  string
		c    client.Client
		list client.ObjectList
		ns   string
		ok   bool
	}
	for _, k := range []check{
		{"driver", dc, &corev1.PersistentVolumeClaimList{}, w.ns, false},
		{"driver", dc, &corev1.PersistentVolumeList{}, "", false},
		{"driver", dc, &storagev1.VolumeAttachmentList{}, "", false},
		{"driver", dc, &corev1.SecretList{}, install.SystemNamespace, false},
		{"driver", dc, &storagev1alpha1.CStorVolumeList{}, install.SystemNamespace, true},
		{"driver", dc, &storagev1alpha1.CStorPoolList{}, "", true},
		{"sidecar", sc, &corev1.PersistentVolumeClaimList{}, w.ns, true},
		{"sidecar", sc, &storagev1.VolumeAttachmentList{}, "", true},
		{"sidecar", sc, &corev1.SecretList{}, install.SystemNamespace, false},
		{"sidecar", sc, &storagev1alpha1.CStorVolumeList{}, install.SystemNamespace, false},
		{"sidecar", sc, &storagev1alpha1.CStorPoolList{}, "", false},
		{"sidecar", sc, &storagev1alpha1.CStorVolumeReplicaList{}, install.SystemNamespace, false},
	} {
		err := k.c.List(ctx, k.list, client.InNamespace(k.ns))
		if k.ok && err != nil {
			t.Errorf("%s listing %T: %v", k.who, k.list, err)
		}
		if !k.ok && !apierrors.IsForbidden(err) {
			t.Errorf("%s listing %T: got %v, want Forbidden", k.who, k.list, err)
		}
	}
	// The sidecar may not write the storage kinds' status (nor anything else of them).
	var pools storagev1alpha1.CStorPoolList
	if err := w.c.List(ctx, &pools); err != nil || len(pools.Items) == 0 {
		t.Fatalf("pools: %v", err)
	}
	p := pools.Items[0].DeepCopy()
	p.Status.Phase = storagev1alpha1.PoolPhaseError
	if err := sc.Status().Update(ctx, p); !apierrors.IsForbidden(err) {
		t.Errorf("sidecar updating CStorPool status: got %v, want Forbidden", err)
	}
	vol := &storagev1alpha1.CStorVolume{ObjectMeta: metav1.ObjectMeta{Namespace: install.SystemNamespace, Name: "rbac-probe"}, Spec: storagev1alpha1.CStorVolumeSpec{Capacity: resource.MustParse("1Mi")}}
	if err := sc.Create(ctx, vol); !apierrors.IsForbidden(err) {
		t.Errorf("sidecar creating a CStorVolume: got %v, want Forbidden", err)
	}
	// The driver writes no status either: the operator reports it.
	if err := dc.Status().Update(ctx, p); !apierrors.IsForbidden(err) {
		t.Errorf("driver updating CStorPool status: got %v, want Forbidden", err)
	}
}

// testProvisionWaitsForNode: replicaCount 3 on 2 nodes is not Bound, the sidecar retries
// with Events, and a third node joining makes it Bound with no user action.
func (w *world) testProvisionWaitsForNode(t *testing.T) {
	ctx := context.Background()
	pvc := w.createPVC(t, "waits")
	w.eventually(t, "retry Events on the PVC", 20*time.Second, func(ctx context.Context) (bool, string, error) {
		evs, err := w.events(ctx, pvc)
		if err != nil {
			return false, "", err
		}
		n, last := 0, ""
		for _, e := range evs {
			if e.Reason == "ProvisioningFailed" && strings.Contains(e.Message, "waiting for 1 more pool") {
				n += int(max(e.Count, 1))
				last = e.Message
			}
		}
		return n >= 2, fmt.Sprintf("%d retries, last %q", n, last), nil
	})
	if err := w.c.Get(ctx, client.ObjectKeyFromObject(pvc), pvc); err != nil {
		t.Fatal(err)
	}
	if pvc.Status.Phase == corev1.ClaimBound || pvc.Spec.VolumeName != "" {
		t.Fatalf("PVC bound with 2 of 3 replicas: %+v", pvc.Status)
	}
	var pvs corev1.PersistentVolumeList
	if err := w.c.List(ctx, &pvs); err != nil || len(pvs.Items) != 0 {
		t.Fatalf("PVs before the volume is ready: %d, %v", len(pvs.Items), err)
	}
	w.addNode("node-3", 3)
	w.waitBound(t, pvc, 30*time.Second)
	if n := len(w.replicaFiles("pvc-" + string(pvc.UID))); n != 3 {
		t.Fatalf("%d replica files, want 3", n)
	}
	w.deletePVCAndWait(t, pvc)
}

// deletePVCAndWait deletes the claim and waits until the PV, the CStorVolume, its replicas
// and their files are gone.
func (w *world) deletePVCAndWait(t *testing.T, pvc *corev1.PersistentVolumeClaim) {
	ctx := context.Background()
	pvName := pvc.Spec.VolumeName
	if err := w.c.Delete(ctx, pvc); err != nil {
		t.Fatal(err)
	}
	w.eventually(t, "PV, volume, replicas and files gone", 30*time.Second, func(ctx context.Context) (bool, string, error) {
		pverr := w.c.Get(ctx, client.ObjectKey{Name: pvName}, &corev1.PersistentVolume{})
		verr := w.c.Get(ctx, client.ObjectKey{Namespace: install.SystemNamespace, Name: pvName}, &storagev1alpha1.CStorVolume{})
		var rs storagev1alpha1.CStorVolumeReplicaList
		if err := w.c.List(ctx, &rs, client.InNamespace(install.SystemNamespace), client.MatchingFields{storagev1alpha1.FieldVolume: pvName}); err != nil {
			return false, "", err
		}
		files := w.replicaFiles(pvName)
		return apierrors.IsNotFound(pverr) && apierrors.IsNotFound(verr) && len(rs.Items) == 0 && len(files) == 0,
			fmt.Sprintf("pv: %v, volume: %v, replicas: %d, files: %v", pverr, verr, len(rs.Items), files), nil
	})
}

// testDriverRestart: the driver is stopped while CreateVolume waits for a replica; the call
// retried with the same name after a restart returns the same volume, and no second one
// exists.
func (w *world) testDriverRestart(t *testing.T) {
	ctx := context.Background()
	conn, err := sidecar.Dial(w.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cc := csi.NewControllerClient(conn)
	req := &csi.CreateVolumeRequest{
		Name:               "restart-me",
		CapacityRange:      &csi.CapacityRange{RequiredBytes: 4 * mib},
		Parameters:         map[string]string{driver.ParamReplicaCount: "4"}, // 3 nodes: waits
		VolumeCapabilities: []*csi.VolumeCapability{mountRWO()},
	}
	errc := make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		_, err := cc.CreateVolume(cctx, req)
		errc <- err
	}()
	id := driver.VolumeID(req.Name)
	w.eventually(t, "the volume created and waiting", 10*time.Second, func(ctx context.Context) (bool, string, error) {
		var v storagev1alpha1.CStorVolume
		err := w.c.Get(ctx, client.ObjectKey{Namespace: install.SystemNamespace, Name: id}, &v)
		return err == nil && v.Status.ReadyReplicas == 3, fmt.Sprintf("%v %d", err, v.Status.ReadyReplicas), nil
	})
	w.stopDriver()
	if err := <-errc; err == nil || !sidecar.Retryable(err) {
		t.Fatalf("CreateVolume interrupted by a driver stop: got %v, want a retryable error", err)
	}
	w.startDriver()
	w.addNode("node-4", 4)
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var resp *csi.CreateVolumeResponse
	for {
		resp, err = cc.CreateVolume(cctx, req)
		if err == nil || !sidecar.Retryable(err) || cctx.Err() != nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("CreateVolume after restart: %v", err)
	}
	if resp.Volume.VolumeId != id {
		t.Fatalf("volume id %s, want %s", resp.Volume.VolumeId, id)
	}
	var vols storagev1alpha1.CStorVolumeList
	if err := w.c.List(ctx, &vols, client.InNamespace(install.SystemNamespace)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, v := range vols.Items {
		if v.Annotations[driver.AnnotationName] == req.Name {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d volumes named %s, want 1", n, req.Name)
	}
	if _, err := cc.DeleteVolume(cctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
	if n := len(w.replicaFiles(id)); n != 0 {
		t.Fatalf("%d replica files left after DeleteVolume", n)
	}
}

func mountRWO() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

// testLifecycle: PVC → Bound with 3 replicas; a VolumeAttachment attaches; deleting the PVC
// does not delete the PV while it is attached; detaching lets everything go.
func (w *world) testLifecycle(t *testing.T) {
	ctx := context.Background()
	pvc := w.createPVC(t, "data")
	w.waitBound(t, pvc, 30*time.Second)
	var pv corev1.PersistentVolume
	if err := w.c.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, &pv); err != nil {
		t.Fatal(err)
	}
	if pv.Name != "pvc-"+string(pvc.UID) || pv.Spec.CSI == nil || pv.Spec.CSI.Driver != driver.Name || pv.Spec.CSI.VolumeHandle != pv.Name ||
		pv.Annotations["pv.kubernetes.io/provisioned-by"] != driver.Name || pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete ||
		len(pv.Finalizers) == 0 || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != pvc.UID {
		t.Fatalf("PV %+v", pv)
	}
	if q := pv.Spec.Capacity[corev1.ResourceStorage]; q.Value() != 8*mib {
		t.Fatalf("PV capacity %s", q.String())
	}
	var vol storagev1alpha1.CStorVolume
	if err := w.c.Get(ctx, client.ObjectKey{Namespace: install.SystemNamespace, Name: pv.Name}, &vol); err != nil {
		t.Fatal(err)
	}
	if vol.Status.ReadyReplicas != 3 || len(w.replicaFiles(pv.Name)) != 3 {
		t.Fatalf("volume %s: %d ready replicas, files %v", vol.Name, vol.Status.ReadyReplicas, w.replicaFiles(pv.Name))
	}

	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: "attach-" + pv.Name},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: driver.Name, NodeName: "node-2",
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To(pv.Name)},
		},
	}
	if err := w.c.Create(ctx, va); err != nil {
		t.Fatal(err)
	}
	w.eventually(t, "attached", 20*time.Second, func(ctx context.Context) (bool, string, error) {
		if err := w.c.Get(ctx, client.ObjectKeyFromObject(va), va); err != nil {
			return false, "", err
		}
		return va.Status.Attached, fmt.Sprintf("%+v", va.Status), nil
	})
	if va.Status.AttachmentMetadata["node"] != "node-2" || len(va.Finalizers) == 0 {
		t.Fatalf("VolumeAttachment %+v", va)
	}
	if err := w.c.Get(ctx, client.ObjectKeyFromObject(&vol), &vol); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(vol.Annotations[driver.AnnotationPublished], "node-2") {
		t.Fatalf("driver did not record the node: %v", vol.Annotations)
	}

	// PVC deleted while attached: the PV is released but stays, with a VolumeFailedDelete
	// Event saying why, and the volume is untouched.
	if err := w.c.Delete(ctx, pvc); err != nil {
		t.Fatal(err)
	}
	w.eventually(t, "PV deletion refused while attached", 20*time.Second, func(ctx context.Context) (bool, string, error) {
		if err := w.c.Get(ctx, client.ObjectKeyFromObject(&pv), &pv); err != nil {
			return false, "", err
		}
		evs, err := w.events(ctx, &pv)
		if err != nil {
			return false, "", err
		}
		for _, e := range evs {
			if e.Reason == "VolumeFailedDelete" && strings.Contains(e.Message, "still attached to node-2") {
				return true, "", nil
			}
		}
		return false, fmt.Sprintf("PV phase %s, %d events", pv.Status.Phase, len(evs)), nil
	})
	if err := w.c.Get(ctx, client.ObjectKeyFromObject(&vol), &vol); err != nil || !vol.DeletionTimestamp.IsZero() {
		t.Fatalf("volume deleted while attached: %v", err)
	}

	if err := w.c.Delete(ctx, va); err != nil {
		t.Fatal(err)
	}
	w.eventually(t, "VolumeAttachment detached and gone", 20*time.Second, func(ctx context.Context) (bool, string, error) {
		err := w.c.Get(ctx, client.ObjectKeyFromObject(va), va)
		return apierrors.IsNotFound(err), fmt.Sprintf("%v %+v", err, va.Status), nil
	})
	pvc.Spec.VolumeName = pv.Name
	w.eventually(t, "PV, volume, replicas and files gone", 40*time.Second, func(ctx context.Context) (bool, string, error) {
		pverr := w.c.Get(ctx, client.ObjectKey{Name: pv.Name}, &corev1.PersistentVolume{})
		verr := w.c.Get(ctx, client.ObjectKeyFromObject(&vol), &storagev1alpha1.CStorVolume{})
		files := w.replicaFiles(pv.Name)
		return apierrors.IsNotFound(pverr) && apierrors.IsNotFound(verr) && len(files) == 0,
			fmt.Sprintf("pv: %v, volume: %v, files: %v", pverr, verr, files), nil
	})
}

// testSanity runs the upstream CSI conformance suite against the driver's socket.
func (w *world) testSanity(t *testing.T) {
	var pools storagev1alpha1.CStorPoolList
	if err := w.c.List(context.Background(), &pools); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := sanity.NewTestConfig()
	cfg.Address = w.socket
	cfg.TargetPath = filepath.Join(dir, "target")
	cfg.StagingPath = filepath.Join(dir, "staging")
	cfg.TestVolumeSize = mib
	// A replica on every node, so the node the driver serves (node-1) has one to publish.
	cfg.TestVolumeParameters = map[string]string{driver.ParamReplicaCount: strconv.Itoa(len(pools.Items))}
	cfg.IdempotentCount = 2
	sanity.Test(t, cfg)
}
