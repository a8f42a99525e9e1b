package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/localsock"
	"github.com/crdipc/crdipc/internal/storage/backend"
	"github.com/crdipc/crdipc/internal/storage/dataca"
	"github.com/crdipc/crdipc/internal/storage/replica"
)

// The agent trusts the published data-path CA certificate and requests its own certificate
// (package dataca): it never sees the CA key.
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get,resourceNames=crdipc-storage-data-ca,namespace=crdipc-system
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests,verbs=create;get;list;watch
// It reads a replica's volume to tell its members from other nodes (authorize).
// +kubebuilder:rbac:groups=storage.crdipc.io,resources=cstorvolumes,verbs=get

// dataServer runs the node's replica data service (package replica) while the agent holds
// the node Lease: two agents of one node never serve the same files. It binds when the
// manager is built, so the endpoint the replicas report is known before any of them is
// reconciled.
type dataServer struct {
	node     string
	ln       net.Listener
	endpoint string
	// localSocket is where the node's CSI plugin reaches the replicas (Options.LocalSocket).
	localSocket string
	namespace   string
	cache       client.Reader        // the agent's cache: its own node's replicas and pools
	kube        kubernetes.Interface // requests the node's certificate
	live        client.Reader        // the API server: volumes are not cached
	backends    func(storagev1alpha1.Backend) (backend.Backend, error)
	log         logr.Logger

	mu        sync.Mutex
	ready     chan struct{} // closed once clientTLS is set
	clientTLS *tls.Config
	srv       *replica.Server          // once serving
	conns     map[string]*replica.Conn // by address: to this node and to its peers
	// checked holds the replicas found current since this data service started.
	checked map[types.UID]bool
}

// current reports whether replica uid was found current since the service started.
func (d *dataServer) current(uid types.UID) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.checked[uid]
}

func (d *dataServer) setCurrent(uid types.UID) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.checked == nil {
		d.checked = map[types.UID]bool{}
	}
	d.checked[uid] = true
}

// newDataServer binds addr. A listen address with no host (":9500") is advertised with
// advertiseHost, which is then required. localSocket, if not empty, is where it also serves
// the node's CSI plugin (Options.LocalSocket).
func newDataServer(node, addr, advertiseHost, localSocket, namespace string, cache, live client.Reader, kube kubernetes.Interface, backends func(storagev1alpha1.Backend) (backend.Backend, error), log logr.Logger) (*dataServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("replica data service: %w", err)
	}
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		if advertiseHost == "" {
			ln.Close()
			return nil, fmt.Errorf("replica data service listens on %s, which peers cannot dial: give the address to advertise (--data-advertise-address, or $POD_IP)", addr)
		}
		host = advertiseHost
	}
	return &dataServer{
		node: node, ln: ln, endpoint: net.JoinHostPort(host, port), localSocket: localSocket, namespace: namespace,
		cache: cache, live: live, kube: kube, backends: backends, log: log.WithName("replica-data"),
		ready: make(chan struct{}), conns: map[string]*replica.Conn{},
	}, nil
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: only the Lease holder serves.
func (d *dataServer) NeedLeaderElection() bool { return true }

// Start implements manager.Runnable: it obtains the node's certificate (for the address it
// advertises), serves until ctx ends and renews the certificate meanwhile.
func (d *dataServer) Start(ctx context.Context) error {
	defer d.closeConns()
	// The local socket first: from here on the node plugin's dials there wait to be served
	// (as those to the TCP listener do) instead of finding no socket and taking TLS.
	var local *localsock.Listener
	if d.localSocket != "" {
		var err error
		if local, err = localsock.Listen("unix", d.localSocket); err != nil {
			d.log.Error(err, "not serving replicas on the local socket: the node plugin reaches them over TLS", "socket", d.localSocket)
		}
	}
	host, _, _ := net.SplitHostPort(d.endpoint)
	id, err := dataca.Obtain(ctx, d.kube, dataca.Request{
		Role: dataca.RoleNode, Node: d.node, IPs: []net.IP{net.ParseIP(host)}, Namespace: d.namespace, Logger: d.log,
	})
	if err != nil {
		d.ln.Close()
		if local != nil {
			local.Close()
		}
		return nil // ctx ended
	}
	go id.Run(ctx)
	serverTLS, clientTLS := id.ServerTLS(), id.ClientTLS()
	d.mu.Lock()
	d.clientTLS = clientTLS
	close(d.ready)
	d.mu.Unlock()
	srv := replica.NewServer(replica.ServerOptions{Node: d.node, Lookup: d.lookup, Authorize: d.authorize, TLS: serverTLS, ClientTLS: clientTLS, Logger: d.log,
		// Only the node's CSI plugin mounts the socket's directory: a connection there is
		// its target, which Authorize lets use the volumes published to this node.
		Local: local, LocalPeer: dataca.CommonName(dataca.RoleCSINode, d.node)})
	d.mu.Lock()
	d.srv = srv
	d.mu.Unlock()
	d.log.Info("serving replica data", "endpoint", d.endpoint)
	return srv.Serve(ctx, d.ln)
}

// resize tells the data service that replica id's data now holds size bytes, so that an
// open replica (a target's writer session) serves the grown size at once. Before the
// service runs there is nothing open to tell: Lookup sizes a replica when it is opened.
func (d *dataServer) resize(id string, size int64) error {
	d.mu.Lock()
	srv := d.srv
	d.mu.Unlock()
	if srv == nil {
		return nil
	}
	if err := srv.Resize(id, size); err != nil && !errors.Is(err, replica.ErrClosed) {
		return err
	}
	return nil
}

// lookup maps a replica id (namespace/name) to its files: only this node's replicas on
// file-backed pools are served.
func (d *dataServer) lookup(id string) (replica.Location, error) {
	ns, name, ok := strings.Cut(id, "/")
	if !ok {
		return replica.Location{}, fmt.Errorf("replica id %q is not namespace/name", id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var r storagev1alpha1.CStorVolumeReplica
	if err := d.cache.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &r); err != nil {
		return replica.Location{}, fmt.Errorf("no replica %s on node %s: %w", id, d.node, err)
	}
	if r.Spec.NodeName != d.node {
		return replica.Location{}, fmt.Errorf("replica %s lives on node %s, not %s", id, r.Spec.NodeName, d.node)
	}
	var pool storagev1alpha1.CStorPool
	if err := d.cache.Get(ctx, client.ObjectKey{Name: r.Spec.Pool}, &pool); err != nil {
		return replica.Location{}, fmt.Errorf("pool %s of replica %s: %w", r.Spec.Pool, id, err)
	}
	b, err := d.backends(pool.Spec.Backend)
	if err != nil {
		return replica.Location{}, err
	}
	f, ok := b.(*backend.File)
	if !ok {
		return replica.Location{}, fmt.Errorf("replica %s is on a %s pool: the data path serves file-backed pools only", id, pool.Spec.Backend)
	}
	size, err := storagev1alpha1.Bytes(r.Spec.Capacity)
	if err != nil {
		return replica.Location{}, fmt.Errorf("replica %s: %w", id, err)
	}
	path, err := f.ReplicaFile(pool.Name, backendReplica(&r))
	if err != nil {
		return replica.Location{}, fmt.Errorf("replica %s: %w", id, err)
	}
	// spec.capacity may have grown before the file did (the agent grows it next): serve
	// what the file holds until then, never more; the agent resizes the open replica.
	if fi, err := os.Lstat(path); err == nil && fi.Mode().IsRegular() && fi.Size() < size {
		size = fi.Size()
	}
	return replica.Location{Data: path, Meta: path + backend.MetaSuffix, Size: size}, nil
}

// authorize lets peer use replica id only if it is a member of the replica's volume: the
// agent of a node holding one of the volume's replicas (they rebuild from each other), or
// the CSI node service of a node the volume is published to (where its target runs). A
// volume published nowhere has no known target yet: any node's CSI node service may be it
// (a tool or test that stages without ControllerPublish). A snapshot of the replica may
// also be read by the agent of a node holding a replica restored from it.
func (d *dataServer) authorize(peer, id string) error {
	role, node, err := dataca.ParseCommonName(peer)
	if err != nil {
		return err
	}
	if role == dataca.RoleController {
		// It snapshots volumes staged nowhere and deletes snapshot copies; it can already
		// make a volume of any snapshot through the API.
		return nil
	}
	if role == dataca.RoleNode && node == d.node {
		// This agent itself (its own replicas' revisions, asked when each is created): no
		// read of the volume is needed to let it in, which saves a new volume one GET per
		// replica on its way to Ready.
		return nil
	}
	id, snapUID, isSnap := replica.SplitSnapshotID(id)
	ns, name, ok := strings.Cut(id, "/")
	if !ok {
		return fmt.Errorf("replica id %q is not namespace/name", id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var r storagev1alpha1.CStorVolumeReplica
	if err := d.cache.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &r); err != nil {
		return fmt.Errorf("replica %s: %w", id, err)
	}
	var vol storagev1alpha1.CStorVolume
	if err := d.live.Get(ctx, client.ObjectKey{Namespace: ns, Name: r.Spec.Volume}, &vol); err != nil {
		return fmt.Errorf("volume %s/%s of replica %s: %w", ns, r.Spec.Volume, id, err)
	}
	switch role {
	case dataca.RoleNode:
		if slices.ContainsFunc(vol.Status.Replicas, func(s storagev1alpha1.VolumeReplicaStatus) bool { return s.Node == node }) {
			return nil
		}
		if isSnap {
			restoring, err := d.restoring(ctx, node, ns, snapUID)
			if err != nil || restoring {
				return err
			}
		}
		return fmt.Errorf("node %s holds no replica of volume %s/%s", node, ns, vol.Name)
	default:
		published := storagev1alpha1.PublishedNodes(&vol)
		if _, ok := published[node]; ok || len(published) == 0 {
			return nil
		}
		return fmt.Errorf("volume %s/%s is published to %v, not to node %s", ns, vol.Name, slices.Sorted(maps.Keys(published)), node)
	}
}

// restoring reports whether node holds a replica in ns being filled from the snapshot whose
// UID is snapUID (the snapshot part of a snapshot's data id).
func (d *dataServer) restoring(ctx context.Context, node, ns, snapUID string) (bool, error) {
	var list storagev1alpha1.CStorVolumeReplicaList
	if err := d.live.List(ctx, &list, client.InNamespace(ns), client.MatchingFields{storagev1alpha1.FieldNodeName: node}); err != nil {
		return false, fmt.Errorf("replicas of node %s: %w", node, err)
	}
	for _, r := range list.Items {
		if r.Spec.Source == nil || r.Spec.Source.Snapshot == "" {
			continue
		}
		var snap storagev1alpha1.CStorVolumeSnapshot
		if err := d.live.Get(ctx, client.ObjectKey{Namespace: ns, Name: r.Spec.Source.Snapshot}, &snap); err != nil {
			continue
		}
		if string(snap.UID) == snapUID {
			return true, nil
		}
	}
	return false, nil
}

// fill starts filling replica id, served here, from local (named name), as Server.Fill.
func (d *dataServer) fill(id, name string, local replica.Source) error {
	d.mu.Lock()
	srv := d.srv
	d.mu.Unlock()
	if srv == nil {
		return errors.New("the replica data service is not serving yet")
	}
	return srv.Fill(id, name, local)
}

// client returns a client for replica id on the data service at addr (this node's or a
// peer's), over one shared connection per address; it fails until the service has its
// certificate.
func (d *dataServer) client(ctx context.Context, addr, id string) (*replica.Client, error) {
	select {
	case <-d.ready:
	default:
		return nil, errors.New("the replica data service has no certificate yet")
	}
	d.mu.Lock()
	c := d.conns[addr]
	d.mu.Unlock()
	if c != nil {
		return c.Replica(id), nil
	}
	c, err := replica.Dial(ctx, addr, d.clientTLS)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	if old := d.conns[addr]; old != nil {
		c.Close()
		c = old
	} else {
		d.conns[addr] = c
	}
	d.mu.Unlock()
	return c.Replica(id), nil
}

// drop forgets the connection to addr after an error, so the next call dials anew.
func (d *dataServer) drop(addr string) {
	d.mu.Lock()
	c := d.conns[addr]
	delete(d.conns, addr)
	d.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

func (d *dataServer) closeConns() {
	d.mu.Lock()
	conns := d.conns
	d.conns = map[string]*replica.Conn{}
	d.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}
