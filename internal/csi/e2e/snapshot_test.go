package e2e_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	snapclientset "github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/csi/driver"
	"github.com/crdipc/crdipc/internal/csi/nodeservice"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/podsim"
	"github.com/crdipc/crdipc/internal/podsim/busybox"
	"github.com/crdipc/crdipc/internal/testenv"
)

// startKubelet runs the simulated kubelet of up on every node until the test ends, with a
// CSI node plugin per node, and returns the pods' root (each container's log is
// <root>/<pod UID>/<container>.log).
func (w *world) startKubelet(t *testing.T) string {
	t.Helper()
	podRoot := t.TempDir()                      // inside the drivers' kubelet root, os.TempDir()
	csiDir, err := os.MkdirTemp("", "csi-pods") // socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(csiDir) })
	csiNode := w.env.AsServiceAccount(t, "csi-node")
	nodes, err := nodeservice.New(nodeservice.Options{Config: csiNode, NodeConfig: func(node string) (*rest.Config, error) { return testenv.BoundTo(csiNode, node), nil }, Dir: csiDir, KubeletRoot: podRoot})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nodes.Stop) // after the kubelet, which unmounts through them
	mgr := testenv.NewManager(t, w.env.Config)
	if err := podsim.Add(mgr, podsim.Options{
		Root: podRoot, Images: map[string]podsim.Image{busybox.Name: busybox.Image{}},
		RestartBackoff: time.Second, StopTimeout: 5 * time.Second, CSI: nodes.Client, CSIDriver: driver.Name,
	}); err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, "kubelet", mgr.Start)
	testenv.Eventually(t, 30*time.Second, "the default ServiceAccount", func(ctx context.Context) (bool, error) {
		err := w.c.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: "default"}, &corev1.ServiceAccount{})
		return err == nil, err
	})
	return podRoot
}

// busyboxPod is a pod on node running script with claim mounted at /data.
func (w *world) busyboxPod(name, node, claim, script string, restart corev1.RestartPolicy) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy:                 restart,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			NodeSelector:                  map[string]string{corev1.LabelHostname: node},
			Containers: []corev1.Container{{
				Name: "main", Image: "busybox:1.36", Command: []string{"sh", "-c", script},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
			}}},
		},
	}
}

// runPod creates pod and deletes it at the end of the test, waiting until it is gone (its
// volume unstaged) while the kubelet still runs.
func (w *world) runPod(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	if err := w.c.Create(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.deletePod(t, pod) })
}

func (w *world) deletePod(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	if err := w.c.Delete(context.Background(), pod); client.IgnoreNotFound(err) != nil {
		t.Errorf("deleting pod %s: %v", pod.Name, err)
	}
	testenv.Eventually(t, 60*time.Second, "pod "+pod.Name+" gone", func(ctx context.Context) (bool, error) {
		if err := w.c.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{}); !apierrors.IsNotFound(err) {
			return false, fmt.Errorf("get: %v", err)
		}
		return true, nil
	})
}

// podLog waits until the log of pod's container main holds want and returns it.
func (w *world) podLog(t *testing.T, podRoot string, pod *corev1.Pod, want string, timeout time.Duration) string {
	t.Helper()
	var out string
	testenv.Eventually(t, timeout, fmt.Sprintf("pod %s logging %q", pod.Name, want), func(ctx context.Context) (bool, error) {
		var p corev1.Pod
		if err := w.c.Get(ctx, client.ObjectKeyFromObject(pod), &p); err != nil {
			return false, err
		}
		b, _ := os.ReadFile(filepath.Join(podRoot, string(p.UID), "main.log"))
		out = string(b)
		if !strings.Contains(out, want) {
			evs, _ := w.events(ctx, &p)
			var seen []string
			for _, e := range evs {
				seen = append(seen, e.Reason+": "+e.Message)
			}
			return false, fmt.Errorf("pod %s; log %q; events: %s", p.Status.Phase, out, strings.Join(seen, " | "))
		}
		return true, nil
	})
	return out
}

// testPodSnapshots is issue 12's acceptance for snapshots, restores and clones, with real
// storage and pods: a busybox pod on node-2 writes file a to a claim and keeps it mounted; a
// VolumeSnapshot of the claim becomes ready to use (taken by the volume's target on node-2,
// its file system frozen meanwhile); the same pod then writes file b. A claim restored from
// the snapshot holds a and not b; a claim cloned from the live claim (the pod still running)
// holds a and b — pods on node-1 read them. Deleting the VolumeSnapshot deletes its content
// and the CStorVolumeSnapshot.
func (w *world) testPodSnapshots(t *testing.T) {
	testenv.RequireMounts(t)
	ctx := context.Background()
	podRoot := w.startKubelet(t)
	snaps, err := snapclientset.NewForConfig(w.env.Config)
	if err != nil {
		t.Fatal(err)
	}
	claim := func(name string, source *corev1.TypedLocalObjectReference) *corev1.PersistentVolumeClaim {
		t.Helper()
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name},
			Spec: corev1.PersistentVolumeClaimSpec{
				StorageClassName: ptr.To(class),
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")}},
				DataSource:       source,
			},
		}
		if err := w.c.Create(ctx, pvc); err != nil {
			t.Fatal(err)
		}
		// After the pods' cleanups (registered later, run earlier): their volumes are
		// unstaged first.
		t.Cleanup(func() {
			if err := w.c.Delete(context.Background(), pvc); client.IgnoreNotFound(err) != nil {
				t.Errorf("deleting claim %s: %v", pvc.Name, err)
			}
		})
		return pvc
	}

	src := claim("snap-source", nil)
	w.waitBound(t, src, 60*time.Second)
	// The pod waits for this file, on the host (the simulated kubelet runs the host's sh),
	// before writing b: "after the snapshot" is then an order, not a guess.
	goOn := filepath.Join(t.TempDir(), "write-b")
	writer := w.busyboxPod("snap-writer", "node-2", src.Name, `set -e
head -c 1048576 /dev/urandom > /data/a
sha256sum /data/a > /data/a.sha256
sync
echo wrote a
while [ ! -e `+goOn+` ]; do sleep 0.2; done
head -c 1048576 /dev/urandom > /data/b
sha256sum /data/b > /data/b.sha256
sync
echo wrote b
while :; do sleep 1; done`, corev1.RestartPolicyNever)
	w.runPod(t, writer)
	w.podLog(t, podRoot, writer, "wrote a\n", 90*time.Second)

	vs := &snapv1.VolumeSnapshot{
		ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "after-a"},
		Spec: snapv1.VolumeSnapshotSpec{
			Source:                  snapv1.VolumeSnapshotSource{PersistentVolumeClaimName: ptr.To(src.Name)},
			VolumeSnapshotClassName: ptr.To(class),
		},
	}
	if vs, err = snaps.SnapshotV1().VolumeSnapshots(w.ns).Create(ctx, vs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			_ = snaps.SnapshotV1().VolumeSnapshots(w.ns).Delete(context.Background(), vs.Name, metav1.DeleteOptions{})
		}
	})
	testenv.Eventually(t, 90*time.Second, "VolumeSnapshot after-a ready to use", func(ctx context.Context) (bool, error) {
		if vs, err = snaps.SnapshotV1().VolumeSnapshots(w.ns).Get(ctx, vs.Name, metav1.GetOptions{}); err != nil {
			return false, err
		}
		if st := vs.Status; st == nil || st.ReadyToUse == nil || !*st.ReadyToUse {
			return false, fmt.Errorf("status %s", describeSnapshotStatus(st))
		}
		return true, nil
	})
	content, err := snaps.SnapshotV1().VolumeSnapshotContents().Get(ctx, *vs.Status.BoundVolumeSnapshotContentName, metav1.GetOptions{})
	if err != nil || content.Status == nil || content.Status.SnapshotHandle == nil {
		t.Fatalf("content of after-a: %+v, %v; want one with a snapshot handle", content, err)
	}
	handle := *content.Status.SnapshotHandle
	var css storagev1alpha1.CStorVolumeSnapshot
	if err := w.c.Get(ctx, client.ObjectKey{Namespace: install.SystemNamespace, Name: handle}, &css); err != nil {
		t.Fatalf("CStorVolumeSnapshot %s: %v", handle, err)
	}
	if css.Spec.Volume != src.Spec.VolumeName || len(css.Status.Copies) != 3 {
		t.Errorf("CStorVolumeSnapshot %s: volume %s, copies %+v; want 3 copies of %s", handle, css.Spec.Volume, css.Status.Copies, src.Spec.VolumeName)
	}
	// The volume is in use on node-2: its target there takes the copy.
	if !strings.HasPrefix(css.Status.TakenBy, "node-2") {
		t.Errorf("CStorVolumeSnapshot %s taken by %q, want node-2, where the pod uses the volume", handle, css.Status.TakenBy)
	}

	if err := os.WriteFile(goOn, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	w.podLog(t, podRoot, writer, "wrote b\n", 30*time.Second)

	restored := claim("snap-restored", &corev1.TypedLocalObjectReference{APIGroup: ptr.To(snapv1.GroupName), Kind: "VolumeSnapshot", Name: vs.Name})
	cloned := claim("snap-cloned", &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: src.Name})
	w.waitBound(t, restored, 120*time.Second)
	w.waitBound(t, cloned, 120*time.Second)

	const check = `cd /data
ls
sha256sum -c a.sha256 >/dev/null && echo "a intact" || echo "a MISSING"
if [ -e b ]; then sha256sum -c b.sha256 >/dev/null && echo "b intact" || echo "b BROKEN"; else echo "b absent"; fi
echo done`
	for _, tc := range []struct {
		claim      *corev1.PersistentVolumeClaim
		want, not  []string
		descripton string
	}{
		{restored, []string{"a intact", "b absent"}, []string{"b intact"}, "restored from the snapshot"},
		{cloned, []string{"a intact", "b intact"}, []string{"b absent"}, "cloned from the live claim"},
	} {
		reader := w.busyboxPod("read-"+tc.claim.Name, "node-1", tc.claim.Name, check, corev1.RestartPolicyNever)
		w.runPod(t, reader)
		out := w.podLog(t, podRoot, reader, "done\n", 90*time.Second)
		for _, s := range tc.want {
			if !strings.Contains(out, s+"\n") {
				t.Errorf("claim %s (%s): want %q; the reader logged:\n%s", tc.claim.Name, tc.descripton, s, out)
			}
		}
		for _, s := range tc.not {
			if strings.Contains(out, s+"\n") {
				t.Errorf("claim %s (%s): %q; the reader logged:\n%s", tc.claim.Name, tc.descripton, s, out)
			}
		}
		w.deletePod(t, reader)
	}
	// The clone's own snapshot of the source is gone once the clone is Bound: only after-a
	// is left of the source's snapshots.
	var left storagev1alpha1.CStorVolumeSnapshotList
	if err := w.c.List(ctx, &left, client.InNamespace(install.SystemNamespace), client.MatchingFields{storagev1alpha1.FieldVolume: src.Spec.VolumeName}); err != nil {
		t.Fatal(err)
	}
	if len(left.Items) != 1 || left.Items[0].Name != handle {
		var names []string
		for _, s := range left.Items {
			names = append(names, s.Name)
		}
		t.Errorf("snapshots of the source volume after the clone: %v, want only %s", names, handle)
	}

	deleted = true
	if err := snaps.SnapshotV1().VolumeSnapshots(w.ns).Delete(ctx, vs.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the VolumeSnapshot, its content and the CStorVolumeSnapshot gone", func(ctx context.Context) (bool, error) {
		_, verr := snaps.SnapshotV1().VolumeSnapshots(w.ns).Get(ctx, vs.Name, metav1.GetOptions{})
		_, cerr := snaps.SnapshotV1().VolumeSnapshotContents().Get(ctx, content.Name, metav1.GetOptions{})
		serr := w.c.Get(ctx, client.ObjectKey{Namespace: install.SystemNamespace, Name: handle}, &storagev1alpha1.CStorVolumeSnapshot{})
		if !apierrors.IsNotFound(verr) || !apierrors.IsNotFound(cerr) || !apierrors.IsNotFound(serr) {
			return false, fmt.Errorf("snapshot: %v; content: %v; CStorVolumeSnapshot: %v", verr, cerr, serr)
		}
		return true, nil
	})
}

func describeSnapshotStatus(st *snapv1.VolumeSnapshotStatus) string {
	if st == nil {
		return "none"
	}
	s := fmt.Sprintf("bound to %v, ready %v", ptr.Deref(st.BoundVolumeSnapshotContentName, ""), ptr.Deref(st.ReadyToUse, false))
	if st.Error != nil && st.Error.Message != nil {
		s += ", error: " + *st.Error.Message
	}
	return s
}
