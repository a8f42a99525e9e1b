package sidecar

import (
	"context"
	goruntime "runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/crdipc/crdipc/internal/csi/driver"
)

// TestNewProvisionerLeavesClientGoSchemeAlone: the sidecar builds the library's
// ProvisionController once its manager runs, long after the clients of its process started
// decoding with client-go's scheme (in up: the control plane's controllers, the services
// started before it). Building it must not write that scheme: a write beside their reads is
// "fatal error: concurrent map read and map write". The race detector reports any such write
// (make test-race); without it, the decoders below may crash the test binary.
func TestNewProvisionerLeavesClientGoSchemeAlone(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pod, err := runtime.Encode(clientgoscheme.Codecs.LegacyCodec(corev1.SchemeGroupVersion), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}})
	if err != nil {
		t.Fatal(err)
	}
	// Decoders, as every typed client and informer of the process.
	var decoded atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dec := clientgoscheme.Codecs.UniversalDeserializer()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, _, err := dec.Decode(pod, nil, nil); err != nil {
					t.Error(err)
					return
				}
				decoded.Add(1)
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()
	for decoded.Load() == 0 && !t.Failed() {
		// Until the decoders run: a few microseconds.
		goruntime.Gosched()
	}
	// Built as Add builds it; no API server is reached before Run.
	o := Options{}
	o.defaults()
	cfg := &rest.Config{Host: "http://127.0.0.1:1"}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if _, err := newProvisioner(ctx, cfg, kube, nil, driver.Name, nil, nil, o, nil, logr.Discard()); err != nil {
			t.Fatal(err)
		}
	}
}
