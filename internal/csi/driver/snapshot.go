package driver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/mountinfo"
	"github.com/crdipc/crdipc/internal/storage/target"
)

// +kubebuilder:rbac:groups=storage.crdipc.io,resources=cstorvolumesnapshots,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=storage.crdipc.io,resources=cstorvolumesnapshots/status,verbs=get;update;patch
// DeleteSnapshot finds the copies' data services through their replicas.
// +kubebuilder:rbac:groups=storage.crdipc.io,resources=cstorvolumereplicas,verbs=get

// CreateSnapshot implements csi.ControllerServer: it asks for a CStorVolumeSnapshot of the
// volume, named after req.Name as volumes are (so a retried call finds it), and returns once
// it is taken. The driver on the node the volume is published to takes it with the volume's
// running target; a volume published nowhere is taken here, by a target started for the
// copy. Taken elsewhere and not done within the call → Aborted (the sidecar calls again).
func (d *Driver) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	if req.GetSourceVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "source_volume_id is required")
	}
	if len(req.GetParameters()) > 0 {
		return nil, status.Errorf(codes.InvalidArgument, "snapshot parameters are not supported (got %s)", strings.Join(sortedKeys(req.GetParameters()), ", "))
	}
	vol := newVolume()
	if err := d.c.Get(ctx, d.volumeKey(req.GetSourceVolumeId()), vol); apierrors.IsNotFound(err) {
		return nil, status.Errorf(codes.NotFound, "volume %s not found", req.GetSourceVolumeId())
	} else if err != nil {
		return nil, apiError("reading volume", err)
	}
	snap, err := d.snapshot(ctx, req.GetName(), vol, nil)
	if err != nil {
		return nil, err
	}
	s, err := csiSnapshot(snap)
	if err != nil {
		return nil, err
	}
	return &csi.CreateSnapshotResponse{Snapshot: s}, nil
}

// snapshot returns the snapshot of vol named name once it is taken, asking for it if need
// be (with labels): taken here when it falls to this node, else awaited.
func (d *Driver) snapshot(ctx context.Context, name string, vol *storagev1alpha1.CStorVolume, labels map[string]string) (*storagev1alpha1.CStorVolumeSnapshot, error) {
	snap, err := d.snapshotFor(ctx, name, vol, labels)
	if err != nil || snap.Status.ReadyToUse {
		return snap, err
	}
	node := snap.Labels[storagev1alpha1.LabelSnapshotNode]
	if node != "" && node != d.o.NodeID {
		return snap, d.awaitSnapshot(ctx, snap)
	}
	// Published nowhere (or here): taken here, by the volume's target if it runs here, else
	// by one started for the copy. A volume staged on a node without being published (no
	// attach-detach controller runs in up) makes that fail, its target holding the replicas:
	// the driver that stages it takes it instead (serveSnapshots), and this call waits.
	if err = d.takeSnapshot(ctx, snap); err != nil {
		if aerr := d.awaitSnapshot(ctx, snap); aerr == nil {
			return snap, nil
		}
	}
	return snap, err
}

// snapshotFor returns the snapshot of vol named name, creating it (with extra labels) if
// need be.
func (d *Driver) snapshotFor(ctx context.Context, name string, vol *storagev1alpha1.CStorVolume, extra map[string]string) (*storagev1alpha1.CStorVolumeSnapshot, error) {
	id := VolumeID(name)
	snap := &storagev1alpha1.CStorVolumeSnapshot{}
	err := d.c.Get(ctx, client.ObjectKey{Namespace: d.o.Namespace, Name: id}, snap)
	if apierrors.IsNotFound(err) {
		node := d.o.NodeID
		if nodes := sortedKeys(published(vol)); len(nodes) > 0 {
			node = nodes[0] // one node at a time: where its target runs
		}
		labels := map[string]string{"app.kubernetes.io/managed-by": Name}
		maps.Copy(labels, extra)
		if node != "" {
			labels[storagev1alpha1.LabelSnapshotNode] = node
		}
		snap = &storagev1alpha1.CStorVolumeSnapshot{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: d.o.Namespace, Name: id,
				Annotations: map[string]string{AnnotationName: name},
				Labels:      labels,
			},
			Spec: storagev1alpha1.CStorVolumeSnapshotSpec{Volume: vol.Name},
		}
		err = d.c.Create(ctx, snap)
		if apierrors.IsAlreadyExists(err) {
			snap = &storagev1alpha1.CStorVolumeSnapshot{}
			err = d.c.Get(ctx, client.ObjectKey{Namespace: d.o.Namespace, Name: id}, snap)
		}
	}
	if err != nil {
		return nil, apiError("snapshot "+id, err)
	}
	if snap.Annotations[AnnotationName] != name || snap.Spec.Volume != vol.Name {
		return nil, status.Errorf(codes.AlreadyExists, "snapshot %s exists for volume %s (requested as %q)", id, snap.Spec.Volume, snap.Annotations[AnnotationName])
	}
	if !snap.DeletionTimestamp.IsZero() {
		return nil, status.Errorf(codes.Aborted, "snapshot %s is being deleted", id)
	}
	return snap, nil
}

// awaitSnapshot waits, within the call's deadline less a margin, for the driver of another
// node to take snap.
func (d *Driver) awaitSnapshot(ctx context.Context, snap *storagev1alpha1.CStorVolumeSnapshot) error {
	wait := d.o.CreateTimeout
	if dl, ok := ctx.Deadline(); ok {
		wait = time.Until(dl) - time.Second
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(max(wait, 0))
	key := client.ObjectKeyFromObject(snap)
	for {
		if err := d.c.Get(ctx, key, snap); err != nil {
			return apiError("reading snapshot", err)
		}
		if snap.Status.ReadyToUse {
			return nil
		}
		select {
		case <-tick.C:
		case <-deadline:
			msg := "not taken yet"
			if c := meta.FindStatusCondition(snap.Status.Conditions, conditions.TypeReady); c != nil && c.Message != "" {
				msg = c.Message
			}
			return status.Errorf(codes.Aborted, "snapshot %s is taken by the driver on node %q: %s", snap.Name, snap.Labels[storagev1alpha1.LabelSnapshotNode], msg)
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// snapshotTakeTimeout bounds a take once no call waits for it: the copy of the largest
// volume on a busy node, with room to spare.
const snapshotTakeTimeout = 30 * time.Minute

// takeSnapshot takes snap with the volume's target if it runs here (its file system frozen
// meanwhile), else with a target started for the copy, whose exclusive writer sessions keep
// any other from starting until it is done; and reports the outcome on snap's status.
//
// The take outlives the call that started it: a copy can take longer than one call's
// deadline (the CO cuts CreateVolume and CreateSnapshot short and retries), and a take
// cancelled with each call would start over with every retry and never finish. Later calls
// for the same snapshot join the take in flight; one that ends first returns its context's
// error and the take goes on.
func (d *Driver) takeSnapshot(ctx context.Context, snap *storagev1alpha1.CStorVolumeSnapshot) error {
	key := client.ObjectKeyFromObject(snap)
	done := d.taking.DoChan(string(snap.UID), func() (any, error) {
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), snapshotTakeTimeout)
		defer cancel()
		// Read afresh, into a copy of its own (the caller may be gone before it ends): a
		// snapshot taken is never taken again (a repeat could fail where the first
		// succeeded, on a replica faulted since).
		fresh := &storagev1alpha1.CStorVolumeSnapshot{}
		if err := d.c.Get(tctx, key, fresh); err != nil {
			return nil, apiError("reading snapshot", err)
		}
		if fresh.Status.ReadyToUse {
			return nil, nil
		}
		return nil, d.take(tctx, fresh)
	})
	select {
	case r := <-done:
		if r.Err != nil {
			return r.Err
		}
	case <-ctx.Done():
		return status.Errorf(status.FromContextError(ctx.Err()).Code(), "snapshot %s is still being taken (it goes on; ask again)", snap.Name)
	}
	// The caller's copy: the take updated another.
	if err := d.c.Get(ctx, key, snap); err != nil {
		return apiError("reading snapshot", err)
	}
	return nil
}

// take is takeSnapshot's work.
func (d *Driver) take(ctx context.Context, snap *storagev1alpha1.CStorVolumeSnapshot) error {
	// Another operation on the volume (a stage, another snapshot's take: clones of one
	// source each take their own) goes first; this take waits its turn rather than fail.
	unlock, err := d.awaitVolumeLock(ctx, snap.Spec.Volume)
	if err != nil {
		return err
	}
	defer unlock()
	vol := newVolume()
	if err := d.c.Get(ctx, client.ObjectKey{Namespace: snap.Namespace, Name: snap.Spec.Volume}, vol); err != nil {
		return d.snapshotFailed(ctx, snap, apiError("reading volume "+snap.Spec.Volume, err))
	}
	var (
		info target.SnapshotInfo
		by   string
	)
	if s := d.stagedVolume(vol.Name); s != nil {
		thaw, err := freeze(s.export.Device())
		if err != nil {
			return d.snapshotFailed(ctx, snap, status.Errorf(codes.Internal, "freezing the file system of volume %s: %v", vol.Name, err))
		}
		info, err = s.engine.Snapshot(ctx, string(snap.UID))
		if terr := thaw(); terr != nil {
			d.log.Error(terr, "thawing the file system after a snapshot", "volume", vol.Name)
		}
		if err != nil {
			return d.snapshotFailed(ctx, snap, status.Errorf(codes.Unavailable, "volume %s: %v", vol.Name, err))
		}
		by = d.o.NodeID + " (the volume's target)"
	} else {
		if info, err = d.snapshotAtRest(ctx, vol, string(snap.UID)); err != nil {
			return d.snapshotFailed(ctx, snap, err)
		}
		by = d.o.NodeID + " (a target started for the copy)"
		if d.o.NodeID == "" {
			by = "the controller (a target started for the copy)"
		}
	}
	byID := map[string]storagev1alpha1.VolumeReplicaStatus{}
	for _, r := range vol.Status.Replicas {
		byID[storagev1alpha1.ReplicaDataID(vol.Namespace, r.Name)] = r
	}
	snap.Status.Copies = nil
	for _, id := range info.Replicas {
		if r, ok := byID[id]; ok {
			snap.Status.Copies = append(snap.Status.Copies, storagev1alpha1.SnapshotCopy{Replica: r.Name, Node: r.Node})
		}
	}
	snap.Status.ReadyToUse = true
	snap.Status.CreationTime = &metav1.Time{Time: info.Time}
	snap.Status.Size = resource.NewQuantity(info.Size, resource.BinarySI)
	snap.Status.TakenBy = by
	snap.Status.ObservedGeneration = snap.Generation
	meta.SetStatusCondition(&snap.Status.Conditions, metav1.Condition{
		Type: conditions.TypeReady, Status: metav1.ConditionTrue, Reason: conditions.ReasonSucceeded, ObservedGeneration: snap.Generation,
		Message: fmt.Sprintf("%d copies of %s, revision %d", len(snap.Status.Copies), snap.Status.Size, info.Revision),
	})
	if err := d.c.Status().Update(ctx, snap); err != nil {
		return apiError("reporting snapshot "+snap.Name, err)
	}
	d.log.Info("snapshot taken", "snapshot", snap.Name, "volume", vol.Name, "copies", len(snap.Status.Copies), "by", by)
	return nil
}

// snapshotAtRest takes a snapshot of a volume staged nowhere, with a target of its own.
func (d *Driver) snapshotAtRest(ctx context.Context, vol *storagev1alpha1.CStorVolume, name string) (target.SnapshotInfo, error) {
	if err := checkReplicas(vol); err != nil {
		return target.SnapshotInfo{}, status.Errorf(codes.FailedPrecondition, "volume %s: %v", vol.Name, err)
	}
	tlsConf, err := d.dataTLS(ctx)
	if err != nil {
		return target.SnapshotInfo{}, status.Errorf(codes.Unavailable, "volume %s: the data path: %v", vol.Name, err)
	}
	cf := int(vol.Spec.EffectiveConsistencyFactor())
	e, err := target.New(ctx, target.Options{
		Members:           d.members(vol, tlsConf),
		ConsistencyFactor: cf,
		Size:              servable(vol),
		Logger:            slog.New(logr.ToSlogHandler(d.log.WithValues("volume", vol.Name).WithName("snapshot-target"))),
	})
	if err != nil {
		return target.SnapshotInfo{}, status.Errorf(codes.Unavailable, "volume %s: starting a target for the copy (is it in use on a node?): %v", vol.Name, err)
	}
	defer e.Close()
	if err := e.WaitQuorum(ctx); err != nil {
		return target.SnapshotInfo{}, status.Errorf(codes.Unavailable, "volume %s: waiting for %d healthy replicas: %v", vol.Name, cf, err)
	}
	info, err := e.Snapshot(ctx, name)
	if err != nil {
		return target.SnapshotInfo{}, status.Errorf(codes.Unavailable, "volume %s: %v", vol.Name, err)
	}
	return info, nil
}

// snapshotFailed reports err on snap's Ready condition and returns it.
func (d *Driver) snapshotFailed(ctx context.Context, snap *storagev1alpha1.CStorVolumeSnapshot, err error) error {
	meta.SetStatusCondition(&snap.Status.Conditions, metav1.Condition{
		Type: conditions.TypeReady, Status: metav1.ConditionFalse, Reason: conditions.ReasonFailed, ObservedGeneration: snap.Generation,
		Message: status.Convert(err).Message(),
	})
	if uerr := d.c.Status().Update(ctx, snap); uerr != nil {
		d.log.Error(uerr, "reporting a failed snapshot", "snapshot", snap.Name)
	}
	return err
}

// The file system freeze ioctls (linux/fs.h: _IOWR('X', 119, int) and _IOWR('X', 120,
// int)), which x/sys/unix does not name.
const (
	fiFreeze = 0xC0045877
	fiThaw   = 0xC0045878
)

// freeze freezes the file system mounted from dev (FIFREEZE: dirty data is written and new
// writes wait), so the snapshot holds it as a clean unmount would; block volumes have none
// and are not touched. thaw undoes it.
func freeze(dev string) (thaw func() error, err error) {
	point, ok, err := mountOf(dev)
	if err != nil {
		return nil, err
	}
	if !ok {
		return func() error { return nil }, nil
	}
	f, err := os.Open(point)
	if err != nil {
		return nil, err
	}
	if err := unix.IoctlSetInt(int(f.Fd()), fiFreeze, 0); err != nil {
		f.Close()
		if errors.Is(err, unix.EOPNOTSUPP) {
			return func() error { return nil }, nil
		}
		return nil, fmt.Errorf("FIFREEZE %s: %w", point, err)
	}
	return func() error {
		defer f.Close()
		if err := unix.IoctlSetInt(int(f.Fd()), fiThaw, 0); err != nil {
			return fmt.Errorf("FITHAW %s: %w", point, err)
		}
		return nil
	}, nil
}

// csiSnapshot is snap as CSI describes it.
func csiSnapshot(snap *storagev1alpha1.CStorVolumeSnapshot) (*csi.Snapshot, error) {
	s := &csi.Snapshot{SnapshotId: snap.Name, SourceVolumeId: snap.Spec.Volume, ReadyToUse: snap.Status.ReadyToUse}
	if snap.Status.Size != nil {
		n, err := storagev1alpha1.Bytes(*snap.Status.Size)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "snapshot %s: size %s: %v", snap.Name, snap.Status.Size, err)
		}
		s.SizeBytes = n
	}
	if t := snap.Status.CreationTime; t != nil {
		s.CreationTime = timestamppb.New(t.Time)
	} else {
		s.CreationTime = timestamppb.New(snap.CreationTimestamp.Time)
	}
	return s, nil
}

// mountOf is where the file system on device dev is mounted whole, if it is.
func mountOf(dev string) (string, bool, error) {
	entries, err := mountinfo.Read(mountinfo.Self)
	if err != nil {
		return "", false, fmt.Errorf("reading the mount table: %w", err)
	}
	for _, e := range entries {
		if e.Source == dev && e.Root == "/" {
			return e.MountPoint, true, nil
		}
	}
	return "", false, nil
}
