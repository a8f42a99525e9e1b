package services

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/internal/podsim"
)

// kubelets are the simulated nodes' own identities: for each node, a client and an Event
// recorder with its kubelet's credentials, made when the node is first served (a Node
// labelled later gets its own too).
type kubelets struct {
	config func(node string) (*rest.Config, error)
	scheme *runtime.Scheme
	mapper meta.RESTMapper

	mu           sync.Mutex
	byNode       map[string]podsim.Kubelet
	broadcasters []events.EventBroadcaster
}

func newKubelets(config func(node string) (*rest.Config, error), scheme *runtime.Scheme, mapper meta.RESTMapper) *kubelets {
	return &kubelets{config: config, scheme: scheme, mapper: mapper, byNode: map[string]podsim.Kubelet{}}
}

// kubelet returns node's kubelet, making it the first time.
func (k *kubelets) kubelet(node string) (podsim.Kubelet, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if kl, ok := k.byNode[node]; ok {
		return kl, nil
	}
	cfg, err := k.config(node)
	if err != nil {
		return podsim.Kubelet{}, fmt.Errorf("credentials of node %s: %w", node, err)
	}
	// Uncached: a kubelet may get what its pods reference, not list or watch it.
	c, err := client.New(cfg, client.Options{Scheme: k.scheme, Mapper: k.mapper})
	if err != nil {
		return podsim.Kubelet{}, fmt.Errorf("client of node %s: %w", node, err)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return podsim.Kubelet{}, fmt.Errorf("client of node %s: %w", node, err)
	}
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: kube.EventsV1()})
	if err := b.StartRecordingToSinkWithContext(context.Background()); err != nil {
		return podsim.Kubelet{}, fmt.Errorf("events of node %s: %w", node, err)
	}
	k.broadcasters = append(k.broadcasters, b)
	kl := podsim.Kubelet{Client: c, Events: b.NewRecorder(k.scheme, "podsim-kubelet")}
	k.byNode[node] = kl
	return kl, nil
}

// client is node's kubelet's client.
func (k *kubelets) client(node string) (client.Client, error) {
	kl, err := k.kubelet(node)
	return kl.Client, err
}

// stop flushes and ends the nodes' Event recorders, once the pods' last Events are recorded.
func (k *kubelets) stop() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, b := range k.broadcasters {
		b.Shutdown()
	}
	k.broadcasters = nil
	k.byNode = map[string]podsim.Kubelet{}
}
