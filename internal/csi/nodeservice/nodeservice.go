// Package nodeservice runs the CSI Node service of crdipc's driver once per node of a
// `crdipc up`, as a node plugin runs on every node of a cluster: each node gets a driver
// instance of its own (its NodeID, its target directory) on a socket of its own, which the
// simulated kubelet (package podsim) dials to stage and publish the volumes of that node's
// pods.
package nodeservice

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"

	"github.com/crdipc/crdipc/internal/csi/driver"
	"github.com/crdipc/crdipc/internal/csi/sidecar"
)

// The node plugin's permissions (config/rbac/csi-node), read-only: it reads the CStorVolume
// it stages (get; list for the CSI Probe) and the published data-path CA certificate, and
// requests its own certificate for the replicas' data services. Creating and deleting volumes is the controller's
// (config/rbac/csi-driver): a node, which runs pods, cannot.
// +kubebuilder:rbac:groups=storage.crdipc.io,resources=cstorvolumes,verbs=get;list,namespace=crdipc-system
// Snapshots of the volumes published to the node are taken there, by its target.
// +kubebuilder:rbac:groups=storage.crdipc.io,resources=cstorvolumesnapshots,verbs=get;list;watch,namespace=crdipc-system
// +kubebuilder:rbac:groups=storage.crdipc.io,resources=cstorvolumesnapshots/status,verbs=get;update;patch,namespace=crdipc-system
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get,resourceNames=crdipc-storage-data-ca,namespace=crdipc-system
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests,verbs=create;get;list;watch

// Options configure a Set.
type Options struct {
	// Config is the API server the drivers use (their only Kubernetes access is the
	// storage kinds).
	Config *rest.Config
	// NodeConfig, when set, returns the config node's driver requests its data-path
	// certificate with (driver.Options.DataConfig): in up, a token bound to the node.
	NodeConfig func(node string) (*rest.Config, error)
	// Dir holds node N's socket, Dir/nodes/N/csi.sock, and its volume targets' FUSE
	// mounts, Dir/targets/N.
	Dir string
	// KubeletRoot is the simulated kubelet's root directory (podsim's Root): the drivers
	// stage and publish only inside it. Required.
	KubeletRoot string
	// ExtraRoots are more directories the drivers stage and publish in (driver.Options).
	ExtraRoots []string
	// LocalReplicaSocket, when set, gives node's driver the socket of the node's pool agent
	// (driver.Options.LocalReplicaSocket).
	LocalReplicaSocket func(node string) string
	// Drivers are instances that serve a node already, such as the controller instance
	// of up, which serves node-1: the Set serves them on the node's socket as they are,
	// so one process never runs two targets of one volume for one node.
	Drivers map[string]*driver.Driver
}

// Set is the Node services of every node that needed one so far; each is started the
// first time it is asked for.
type Set struct {
	o      Options
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	nodes   map[string]*node
	stopped bool
	wg      sync.WaitGroup
}

type node struct {
	conn   *grpc.ClientConn
	client csi.NodeClient
}

// New returns a Set that has started nothing yet.
func New(o Options) (*Set, error) {
	if o.Config == nil || o.Dir == "" || o.KubeletRoot == "" {
		return nil, errors.New("csi node services: a rest config, a directory and a kubelet root are required")
	}
	for _, p := range []*string{&o.Dir, &o.KubeletRoot} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return nil, fmt.Errorf("csi node services: %w", err)
		}
		*p = abs
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Set{o: o, ctx: ctx, cancel: cancel, nodes: map[string]*node{}}, nil
}

// Endpoint is node's socket, unix:///….
func (s *Set) Endpoint(nodeName string) string {
	return "unix://" + filepath.Join(s.o.Dir, "nodes", nodeName, "csi.sock")
}

// Client returns a client of node's Node service, starting the service first if it does
// not run yet.
func (s *Set) Client(nodeName string) (csi.NodeClient, error) {
	// The name becomes a path: only what a Node may be called.
	if errs := validation.IsDNS1123Subdomain(nodeName); len(errs) > 0 {
		return nil, fmt.Errorf("csi node service: invalid node name %q: %s", nodeName, errs[0])
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil, errors.New("csi node services are stopped")
	}
	if n := s.nodes[nodeName]; n != nil {
		return n.client, nil
	}
	d := s.o.Drivers[nodeName]
	if d == nil {
		var err error
		o := driver.Options{Config: s.o.Config, NodeID: nodeName, TargetDir: filepath.Join(s.o.Dir, "targets", nodeName), KubeletRoot: s.o.KubeletRoot, ExtraRoots: s.o.ExtraRoots}
		if s.o.LocalReplicaSocket != nil {
			o.LocalReplicaSocket = s.o.LocalReplicaSocket(nodeName)
		}
		if s.o.NodeConfig != nil {
			o.DataConfig = func() (*rest.Config, error) { return s.o.NodeConfig(nodeName) }
		}
		d, err = driver.New(o)
		if err != nil {
			return nil, fmt.Errorf("csi node service of %s: %w", nodeName, err)
		}
	}
	endpoint := s.Endpoint(nodeName)
	l, err := driver.Listen(endpoint)
	if err != nil {
		return nil, fmt.Errorf("csi node service of %s: %w", nodeName, err)
	}
	conn, err := sidecar.Dial(endpoint)
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("csi node service of %s: %w", nodeName, err)
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = d.ServeListener(s.ctx, l)
	}()
	n := &node{conn: conn, client: csi.NewNodeClient(conn)}
	s.nodes[nodeName] = n
	return n.client, nil
}

// Stop stops every Node service and waits for them. Call it after the kubelet that uses
// them has unpublished and unstaged its volumes: the driver instances keep the targets of
// volumes still staged running, and only NodeUnstageVolume closes their replicas cleanly.
func (s *Set) Stop() {
	s.mu.Lock()
	s.stopped = true
	nodes := s.nodes
	s.nodes = nil
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	for _, n := range nodes {
		_ = n.conn.Close()
	}
}
