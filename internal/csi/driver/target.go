package driver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/storage/blockdev"
	"github.com/crdipc/crdipc/internal/storage/dataca"
	"github.com/crdipc/crdipc/internal/storage/target"
)

// The Node service trusts the published data-path CA certificate and requests its own
// certificate to dial replicas (package dataca): it never sees the CA key.
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get,resourceNames=crdipc-storage-data-ca,namespace=crdipc-system
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests,verbs=create;get;list;watch

// quorumWait is how long a write waits, rather than failing, while fewer than the
// consistency factor of replicas are healthy: a pool agent restarting (a rollout, an
// upgrade) or a replica being caught up after one did is a pause, not an I/O error.
const quorumWait = 5 * time.Minute

// membershipPoll is how often a staged volume's target looks at its CStorVolume for
// replicas that were placed (a node joined) or moved (a replica was replaced).
const membershipPoll = 2 * time.Second

// staged is a volume this node serves: the volume engine writing its replicas, and the
// FUSE file + loop device presenting the engine to the kernel.
type staged struct {
	engine *target.Engine
	export *blockdev.Exported
	stop   context.CancelFunc // ends the membership loop
	done   chan struct{}
}

// targetDir is the directory of volume id's FUSE mount, inside the target directory
// however id is spelt.
func (d *Driver) targetDir(id string) (string, error) {
	dir, err := hostPath(d.o.TargetDir, id)
	if err != nil {
		return "", status.Errorf(codes.Internal, "volume %s: its target directory: %v", id, err)
	}
	return dir, nil
}

// dataTLS is the driver's identity on the data path: csi-node:<node> for a Node service,
// csi-controller for a controller only (it snapshots volumes staged nowhere). The first call
// starts obtaining it (dataca.Obtain) in the background, for as long as the driver serves,
// renewed before it expires: a request may wait for approval longer than a CSI call lasts,
// and a retried call must not make another request. Calls wait for it within their context.
func (d *Driver) dataTLS(ctx context.Context) (*tls.Config, error) {
	d.data.Lock()
	if d.data.ready == nil {
		cfg, err := d.o.Config, error(nil)
		if d.o.DataConfig != nil {
			cfg, err = d.o.DataConfig()
		}
		if err == nil && cfg == nil {
			err = errors.New("no rest config")
		}
		var kube kubernetes.Interface
		if err == nil {
			kube, err = kubernetes.NewForConfig(cfg)
		}
		if err != nil {
			d.data.Unlock()
			return nil, fmt.Errorf("requesting the node's data-path certificate: %w", err)
		}
		life := d.data.life
		if life == nil {
			life = context.Background()
		}
		ready := make(chan struct{})
		d.data.ready = ready
		go func() {
			role := dataca.RoleCSINode
			if d.o.NodeID == "" {
				role = dataca.RoleController
			}
			id, err := dataca.Obtain(life, kube, dataca.Request{Role: role, Node: d.o.NodeID, Namespace: d.o.Namespace, Logger: d.log})
			if err != nil {
				return // the driver stopped serving
			}
			d.data.Lock()
			d.data.tls = id.ClientTLS()
			d.data.Unlock()
			close(ready)
			id.Run(life)
		}()
	}
	ready := d.data.ready
	d.data.Unlock()
	select {
	case <-ready:
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for the driver's data-path certificate (see the CertificateSigningRequests for %s): %w", storagev1alpha1.DataSigner, ctx.Err())
	}
	d.data.Lock()
	defer d.data.Unlock()
	return d.data.tls, nil
}

// startTarget runs volume id's engine on the node and exports it as a loop device: every
// replica in the volume's status becomes a member, the one on this node preferred for
// reads. It waits until ConsistencyFactor replicas are healthy (after an unclean stop the
// others are rebuilt first), bounded by ctx.
func (d *Driver) startTarget(ctx context.Context, id string) (*staged, error) {
	e, tlsConf, err := d.newEngine(ctx, id)
	if err != nil {
		return nil, err
	}
	dir, err := d.targetDir(id)
	if err != nil {
		e.Close()
		return nil, err
	}
	// A target of an earlier driver process that died: its FUSE mount and loop device
	// outlive it and would refuse a new export.
	if err := blockdev.Cleanup(dir); err != nil {
		e.Close()
		return nil, status.Errorf(codes.Internal, "volume %s: removing a stale export at %s: %v", id, dir, err)
	}
	ex, err := blockdev.Export(ctx, e, dir, d.exportOptions(id))
	if err != nil {
		e.Close()
		return nil, status.Errorf(codes.Internal, "volume %s: presenting it as a block device: %v", id, err)
	}
	s := d.follow(id, e, ex, tlsConf)
	d.keep(id, s)
	d.log.Info("volume target started", "volume", id, "device", ex.Device())
	return s, nil
}

// newEngine starts volume id's engine with the replicas its status lists, and waits within
// ctx for ConsistencyFactor of them to be healthy.
func (d *Driver) newEngine(ctx context.Context, id string) (*target.Engine, *tls.Config, error) {
	vol := newVolume()
	if err := d.c.Get(ctx, d.volumeKey(id), vol); apierrors.IsNotFound(err) {
		return nil, nil, status.Errorf(codes.NotFound, "volume %s not found", id)
	} else if err != nil {
		return nil, nil, apiError("reading volume", err)
	}
	if err := checkReplicas(vol); err != nil {
		return nil, nil, status.Errorf(codes.FailedPrecondition, "volume %s: %v; not staging it", id, err)
	}
	if err := d.node().available(); err != nil {
		return nil, nil, status.Errorf(codes.FailedPrecondition, "this node cannot present volumes: %v", err)
	}
	tlsConf, err := d.dataTLS(ctx)
	if err != nil {
		return nil, nil, status.Errorf(codes.Unavailable, "volume %s: the data path: %v", id, err)
	}
	members := d.members(vol, tlsConf)
	cf := int(vol.Spec.EffectiveConsistencyFactor())
	if len(members) < cf {
		return nil, nil, status.Errorf(codes.Unavailable, "volume %s has %d reachable replicas, fewer than its consistency factor %d", id, len(members), cf)
	}
	log := d.log.WithValues("volume", id)
	e, err := target.New(ctx, target.Options{
		Members:           members,
		ConsistencyFactor: cf,
		QuorumWait:        quorumWait,
		Size:              servable(vol),
		Logger:            slog.New(logr.ToSlogHandler(log.WithName("target"))),
		OnReplicaState: func(rid string, s target.State, err error) {
			if err != nil {
				log.Info("replica changed state", "replica", rid, "state", s, "error", err.Error())
			} else {
				log.Info("replica changed state", "replica", rid, "state", s)
			}
		},
	})
	if err != nil {
		return nil, nil, status.Errorf(codes.Unavailable, "volume %s: starting its target: %v", id, err)
	}
	if err := e.WaitQuorum(ctx); err != nil {
		e.Close()
		return nil, nil, status.Errorf(codes.Unavailable, "volume %s: waiting for %d healthy replicas: %v", id, cf, err)
	}
	log.Info("volume engine started", "replicas", len(members), "consistencyFactor", cf)
	return e, tlsConf, nil
}

func (d *Driver) exportOptions(id string) blockdev.Options {
	return blockdev.Options{Logger: slog.New(logr.ToSlogHandler(d.log.WithValues("volume", id).WithName("blockdev")))}
}

// follow makes e and ex a staged volume whose members follow the volume's replicas.
func (d *Driver) follow(id string, e *target.Engine, ex *blockdev.Exported, tlsConf *tls.Config) *staged {
	mctx, stop := context.WithCancel(context.Background())
	s := &staged{engine: e, export: ex, stop: stop, done: make(chan struct{})}
	go d.followMembers(mctx, id, s, tlsConf)
	return s
}

// servable is the size a target of vol may serve: its capacity, or less while the
// operator still grows the replicas to a larger one (status.capacity is what every placed
// replica holds); NodeExpandVolume grows the target once they have grown.
func servable(vol *storagev1alpha1.CStorVolume) int64 {
	size := vol.Spec.Capacity.Value()
	if c := vol.Status.Capacity; c != nil {
		if held, err := storagev1alpha1.Bytes(*c); err == nil && held > 0 && held < size {
			size = held
		}
	}
	return roundDown(size)
}

// members are the replicas of vol that report a data endpoint (checkReplicas has passed).
// The one on this node is reached over the pool agent's local socket, if there is one.
func (d *Driver) members(vol *storagev1alpha1.CStorVolume, tlsConf *tls.Config) []target.Member {
	var ms []target.Member
	for _, r := range vol.Status.Replicas {
		if r.Endpoint == "" {
			continue
		}
		id := storagev1alpha1.ReplicaDataID(vol.Namespace, r.Name)
		if r.Node != d.o.NodeID || d.o.LocalReplicaSocket == "" {
			ms = append(ms, target.RemoteMember(id, r.Endpoint, tlsConf, r.Node == d.o.NodeID))
			continue
		}
		ms = append(ms, target.LocalMember(id, r.Endpoint, tlsConf, target.LocalLink{
			Socket: d.o.LocalReplicaSocket, Node: d.o.NodeID, Dialed: func(localErr error) {
				if localErr != nil {
					d.metrics.localLinks.WithLabelValues("tls").Inc()
					d.log.Info("reaching the replica on this node over TLS: its local socket cannot be used", "volume", vol.Name, "replica", r.Name, "reason", localErr.Error())
					return
				}
				d.metrics.localLinks.WithLabelValues("socket").Inc()
			}, Reading: func(fileErr error) {
				if fileErr != nil {
					d.metrics.localReads.WithLabelValues("socket").Inc()
					d.log.Info("reading the replica on this node over its socket: the pool agent did not hand out its file", "volume", vol.Name, "replica", r.Name, "reason", fileErr.Error())
					return
				}
				d.metrics.localReads.WithLabelValues("file").Inc()
			}}))
	}
	return ms
}

// checkReplicas says why the replica entries of a volume's status are not ones the operator
// writes: names of objects (replica, pool, node) and data endpoints of host:port. The status
// is the operator's, but a replica's name becomes a path on the node that serves it, so a
// status naming "../x" is not one the volume's data may follow.
func checkReplicas(vol *storagev1alpha1.CStorVolume) error {
	for _, r := range vol.Status.Replicas {
		for _, f := range []struct{ what, name string }{{"replica", r.Name}, {"pool", r.Pool}, {"node", r.Node}} {
			if errs := validation.IsDNS1123Subdomain(f.name); len(errs) > 0 {
				return fmt.Errorf("its status names %s %q, which is no valid object name: %s", f.what, f.name, errs[0])
			}
		}
		if r.Endpoint != "" {
			if _, port, err := net.SplitHostPort(r.Endpoint); err != nil || port == "" {
				return fmt.Errorf("its status gives replica %s the data endpoint %q, which is not host:port", r.Name, r.Endpoint)
			}
		}
	}
	return nil
}

// followMembers keeps the engine's members in step with the volume's replicas: a replica
// placed on a node that joined is added (the engine rebuilds it), one that was removed is
// dropped, and one whose data service moved is re-added at its new address.
func (d *Driver) followMembers(ctx context.Context, id string, s *staged, tlsConf *tls.Config) {
	defer close(s.done)
	known := map[string]string{} // member id → endpoint
	vol := newVolume()
	if err := d.c.Get(ctx, d.volumeKey(id), vol); err == nil && checkReplicas(vol) == nil {
		for _, m := range d.members(vol, tlsConf) {
			known[m.ID] = m.Addr
		}
	}
	t := time.NewTicker(membershipPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		vol := newVolume()
		if err := d.c.Get(ctx, d.volumeKey(id), vol); err != nil {
			continue
		}
		if err := checkReplicas(vol); err != nil {
			// The members stay as they are until the status makes sense again.
			d.log.Info("not following the volume's replicas", "volume", id, "error", err.Error())
			continue
		}
		want := map[string]target.Member{}
		for _, m := range d.members(vol, tlsConf) {
			want[m.ID] = m
		}
		for mid, addr := range known {
			if m, ok := want[mid]; !ok || m.Addr != addr {
				if err := s.engine.RemoveMember(mid); err != nil && !errors.Is(err, target.ErrClosed) {
					d.log.Info("removing a replica from the target", "volume", id, "replica", mid, "error", err.Error())
				}
				delete(known, mid)
			}
		}
		for mid, m := range want {
			if _, ok := known[mid]; ok {
				continue
			}
			if err := s.engine.AddMember(m); err != nil {
				d.log.Info("adding a replica to the target", "volume", id, "replica", mid, "error", err.Error())
				continue
			}
			d.log.Info("replica joined the target; rebuilding it", "volume", id, "replica", mid, "endpoint", m.Addr)
			known[mid] = m.Addr
		}
	}
}

// stopTarget ends volume id's target: the loop device and FUSE mount go, their connection
// ends even where another mount namespace holds a copy of them, every replica's writer
// session is closed cleanly (so the next start needs no rebuild), and a stale export left
// by an earlier process is removed.
func (d *Driver) stopTarget(id string) error {
	d.data.Lock()
	s := d.data.staged[id]
	delete(d.data.staged, id)
	d.data.Unlock()
	dir, err := d.targetDir(id)
	if err != nil {
		return err
	}
	if s != nil {
		s.stop()
		<-s.done
		// Nothing is to outlive this process any more: the holder lets go first.
		d.forget(id)
		// The CO has unpublished and unstaged the volume on this node: whatever still uses
		// its loop device or FUSE mount is a copy of the mount table in another namespace
		// (a process that unshared its mounts while the volume was staged). Its connection
		// ends, once what was written has reached the replicas; the writer sessions close,
		// and another node may stage the volume.
		err := s.export.Terminate()
		if cerr := s.engine.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return status.Errorf(codes.Internal, "volume %s: stopping its target: %v", id, err)
		}
	}
	if err := blockdev.Cleanup(dir); err != nil {
		return status.Errorf(codes.Internal, "volume %s: removing the export at %s: %v", id, dir, err)
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return status.Errorf(codes.Internal, "volume %s: removing %s: %v", id, dir, err)
	}
	return nil
}

// stagedVolume returns volume id's running target, or nil.
func (d *Driver) stagedVolume(id string) *staged {
	d.data.Lock()
	defer d.data.Unlock()
	return d.data.staged[id]
}

func (d *Driver) setStaged(id string, s *staged) {
	d.data.Lock()
	defer d.data.Unlock()
	if d.data.staged == nil {
		d.data.staged = map[string]*staged{}
	}
	d.data.staged[id] = s
}
