package podsim_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/internal/podsim"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/testenv"
)

// TestActsAsThePodsNode: as in `crdipc up`, the runtime watches as the read-only account
// crdipc-nodes and does each node's work as that node's kubelet, system:node:<name>. A pod
// bound to node a runs with its Secret in its environment, reports its status and Events
// and is deleted for good, all as node a; node a's credentials can neither write the status
// of node b's pod, delete it, nor read the Secret only node b's pod uses: the Node
// authorizer and NodeRestriction admission refuse them.
func TestActsAsThePodsNode(t *testing.T) {
	s := newSim(t, "a", "b")
	ctx := context.Background()
	kubelets := map[string]podsim.Kubelet{}
	for _, n := range []string{s.node("a"), s.node("b")} {
		cfg := s.env.AsNode(t, n)
		c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
		if err != nil {
			t.Fatal(err)
		}
		b := events.NewBroadcaster(&events.EventSinkImpl{Interface: kubernetes.NewForConfigOrDie(cfg).EventsV1()})
		if err := b.StartRecordingToSinkWithContext(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.Shutdown)
		kubelets[n] = podsim.Kubelet{Client: c, Events: b.NewRecorder(scheme.Scheme, "podsim-kubelet")}
	}
	s.opts.Kubelet = func(node string) (podsim.Kubelet, error) {
		if k, ok := kubelets[node]; ok {
			return k, nil
		}
		return podsim.Kubelet{}, fmt.Errorf("no credentials for node %s in this test", node)
	}
	s.as = s.env.AsServiceAccount(t, "nodes")

	podOn := func(node string) *corev1.Pod {
		s.create(&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: "greeting-" + node},
			Data:       map[string][]byte{"message": []byte("hello " + node)},
		})
		pod := s.pod("on-" + node)
		pod.Spec.NodeName = s.node(node)
		c := &pod.Spec.Containers[0]
		c.Env = append(c.Env, corev1.EnvVar{Name: "GREETING", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "greeting-" + node}, Key: "message",
		}}})
		s.create(pod)
		return pod
	}
	podOn("a")
	podOn("b")
	s.start()
	onA := s.waitPod("on-a", "Ready", isReady)
	onB := s.waitPod("on-b", "Ready", isReady)
	in, err := getInfo(net.JoinHostPort(onA.Status.PodIP, "8080"))
	if err != nil {
		t.Fatal(err)
	}
	if in.Env["GREETING"] != "hello a" {
		t.Errorf("GREETING=%q, want the Secret's, read as node a", in.Env["GREETING"])
	}
	// The runtime's own account may write no Event: this one is node a's.
	testenv.Eventually(t, 30*time.Second, "the Started Event of on-a", func(ctx context.Context) (bool, error) {
		var evs eventsv1.EventList
		if err := s.c.List(ctx, &evs, client.InNamespace(s.ns)); err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Regarding.Name == "on-a" && e.Reason == "Started" {
				return true, nil
			}
		}
		return false, fmt.Errorf("%d Events, none Started for on-a", len(evs.Items))
	})

	a := kubelets[s.node("a")].Client
	forbidden := func(what string, err error) {
		t.Helper()
		if !apierrors.IsForbidden(err) {
			t.Errorf("node a %s: %v, want Forbidden", what, err)
		}
	}
	if err := a.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: "greeting-a"}, &corev1.Secret{}); err != nil {
		t.Errorf("node a reading its pod's Secret: %v", err)
	}
	forbidden("reading node b's pod's Secret", a.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: "greeting-b"}, &corev1.Secret{}))
	failed := onB.DeepCopy()
	failed.Status.Phase = corev1.PodFailed
	forbidden("writing node b's pod's status", a.Status().Update(ctx, failed))
	forbidden("deleting node b's pod", a.Delete(ctx, onB.DeepCopy()))

	// Deleted, it goes for good only once node a, its kubelet, deletes it.
	if err := s.c.Delete(ctx, onA); err != nil {
		t.Fatal(err)
	}
	s.waitGone("on-a")
}
