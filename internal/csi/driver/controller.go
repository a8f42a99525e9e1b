package driver

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/ipc"
)

// ControllerGetCapabilities implements csi.ControllerServer.
func (d *Driver) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var caps []*csi.ControllerServiceCapability
	for _, t := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES,
		csi.ControllerServiceCapability_RPC_GET_CAPACITY,
	} {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// VolumeID is the CStorVolume name (and CSI volume ID) for a CSI volume name. A name that is
// already a DNS label, such as the sidecar's pvc-<uid>, is used as is, so `kubectl get cv`
// shows which PVC a volume belongs to; any other name is hashed. Either way the mapping is a
// function of the name alone, which is what makes CreateVolume idempotent across restarts.
func VolumeID(name string) string {
	if len(validation.IsDNS1123Label(name)) == 0 {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return "csi-" + hex.EncodeToString(sum[:16])
}

// CreateVolume implements csi.ControllerServer: it creates a CStorVolume named after
// req.Name (or finds the one an earlier call created) and awaits it Ready. While the
// operator is still placing replicas the call fails with Aborted — retryable, the volume is
// kept — and never reports a volume that is not there yet.
func (d *Driver) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return nil, err
	}
	if req.GetVolumeContentSource() != nil {
		return nil, status.Error(codes.InvalidArgument, "volume content sources (snapshots, clones) are not supported")
	}
	size, err := d.capacity(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	rf, cf, err := parseParameters(req.GetParameters())
	if err != nil {
		return nil, err
	}

	id := VolumeID(req.GetName())
	vol := newVolume()
	err = d.c.Get(ctx, d.volumeKey(id), vol)
	switch {
	case apierrors.IsNotFound(err):
		vol = &storagev1alpha1.CStorVolume{
			ObjectMeta: metav1.ObjectMeta{
				Namespace:   d.o.Namespace,
				Name:        id,
				Annotations: map[string]string{AnnotationName: req.GetName()},
				Labels:      map[string]string{"app.kubernetes.io/managed-by": Name},
			},
			Spec: storagev1alpha1.CStorVolumeSpec{
				Capacity:          *resource.NewQuantity(size, resource.BinarySI),
				ReplicationFactor: rf,
				ConsistencyFactor: cf,
			},
		}
		if err := d.c.Create(ctx, vol); apierrors.IsAlreadyExists(err) {
			// A concurrent call with the same name won: use its volume.
			vol = newVolume()
			if err := d.c.Get(ctx, d.volumeKey(id), vol); err != nil {
				return nil, apiError("reading volume", err)
			}
		} else if err != nil {
			return nil, apiError("creating volume", err)
		}
	case err != nil:
		return nil, apiError("reading volume", err)
	}
	if err := compatible(vol, req, size, rf, cf); err != nil {
		return nil, err
	}
	if !vol.DeletionTimestamp.IsZero() {
		return nil, status.Errorf(codes.Aborted, "volume %s is still being deleted", id)
	}
	if err := d.awaitReady(ctx, vol); err != nil {
		return nil, err
	}
	return &csi.CreateVolumeResponse{Volume: csiVolume(vol)}, nil
}

// awaitReady waits for vol to be Ready within the caller's deadline, less a margin so the
// answer reaches the caller before it gives up on the call.
func (d *Driver) awaitReady(ctx context.Context, vol *storagev1alpha1.CStorVolume) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(d.o.CreateTimeout)
	}
	margin := time.Until(deadline) / 10
	if margin > time.Second {
		margin = time.Second
	}
	actx, cancel := context.WithDeadline(ctx, deadline.Add(-margin))
	defer cancel()
	err := ipc.Await(actx, d.c, vol, ipc.Ready)
	var terr *ipc.TerminalError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &terr):
		if terr.Reason == conditions.ReasonInvalidSpec {
			return status.Errorf(codes.InvalidArgument, "volume %s: %s", vol.Name, terr.Message)
		}
		return status.Errorf(codes.Internal, "volume %s: %s", vol.Name, terr.Message)
	case errors.Is(err, ipc.ErrDeleted):
		return status.Errorf(codes.Aborted, "volume %s was deleted while it was being created", vol.Name)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		// Not a failure: the volume exists and the operator keeps placing its replicas (for
		// example until a node joins). Aborted tells the caller to retry the same name.
		msg := "waiting for the storage operator"
		if c := meta.FindStatusCondition(vol.Status.Conditions, conditions.TypeReady); c != nil && c.Message != "" {
			msg = c.Message
		}
		return status.Errorf(codes.Aborted, "volume %s is not ready yet: %s", vol.Name, msg)
	default:
		return apiError("awaiting volume", err)
	}
}

// compatible reports ALREADY_EXISTS when an existing volume does not match the request.
func compatible(vol *storagev1alpha1.CStorVolume, req *csi.CreateVolumeRequest, size int64, rf int32, cf *int32) error {
	if n := vol.Annotations[AnnotationName]; n != req.GetName() {
		return status.Errorf(codes.AlreadyExists, "volume id %s belongs to volume name %q", vol.Name, n)
	}
	have := vol.Spec.Capacity.Value()
	r := req.GetCapacityRange()
	if have < r.GetRequiredBytes() || (r.GetLimitBytes() > 0 && have > r.GetLimitBytes()) || (r == nil && have != size) {
		return status.Errorf(codes.AlreadyExists, "volume %q exists with capacity %d bytes, incompatible with the request", req.GetName(), have)
	}
	haveRF := vol.Spec.ReplicationFactor
	if haveRF == 0 {
		haveRF = storagev1alpha1.DefaultReplicationFactor
	}
	if haveRF != rf {
		return status.Errorf(codes.AlreadyExists, "volume %q exists with %d replicas, the request asks for %d", req.GetName(), haveRF, rf)
	}
	if cf != nil && vol.Spec.EffectiveConsistencyFactor() != *cf {
		return status.Errorf(codes.AlreadyExists, "volume %q exists with consistencyFactor %d, the request asks for %d", req.GetName(), vol.Spec.EffectiveConsistencyFactor(), *cf)
	}
	return nil
}

func (d *Driver) capacity(r *csi.CapacityRange) (int64, error) {
	req, lim := r.GetRequiredBytes(), r.GetLimitBytes()
	if req < 0 || lim < 0 {
		return 0, status.Error(codes.InvalidArgument, "capacity must not be negative")
	}
	if lim > 0 && req > lim {
		return 0, status.Errorf(codes.InvalidArgument, "required bytes %d exceed limit bytes %d", req, lim)
	}
	switch {
	case req > 0:
		return req, nil
	case lim > 0 && lim < d.o.DefaultCapacity:
		return lim, nil
	default:
		return d.o.DefaultCapacity, nil
	}
}

func parseParameters(p map[string]string) (int32, *int32, error) {
	rf := storagev1alpha1.DefaultReplicationFactor
	var cf *int32
	for k, v := range p {
		switch {
		case k == ParamReplicaCount:
			n, err := strconv.ParseInt(v, 10, 32)
			if err != nil || n < 1 || n > 5 {
				return 0, nil, status.Errorf(codes.InvalidArgument, "parameter %s=%q: want an integer from 1 to 5", k, v)
			}
			rf = int32(n)
		case k == ParamConsistencyFactor:
			n, err := strconv.ParseInt(v, 10, 32)
			if err != nil || n < 1 {
				return 0, nil, status.Errorf(codes.InvalidArgument, "parameter %s=%q: want a positive integer", k, v)
			}
			c := int32(n)
			cf = &c
		case strings.HasPrefix(k, "csi.storage.k8s.io/"):
			// Set by Kubernetes sidecars (PVC/PV names for drivers that want them); not ours.
		default:
			return 0, nil, status.Errorf(codes.InvalidArgument, "unknown parameter %q (known: %s, %s)", k, ParamReplicaCount, ParamConsistencyFactor)
		}
	}
	if cf != nil && *cf > rf {
		return 0, nil, status.Errorf(codes.InvalidArgument, "consistencyFactor %d exceeds replicaCount %d", *cf, rf)
	}
	return rf, cf, nil
}

// checkCapabilities accepts mount and block access by one node: a crdipc volume is served by
// one node at a time.
func checkCapabilities(caps []*csi.VolumeCapability) error {
	if len(caps) == 0 {
		return status.Error(codes.InvalidArgument, "volume capabilities are required")
	}
	for _, c := range caps {
		if msg := unsupported(c); msg != "" {
			return status.Error(codes.InvalidArgument, msg)
		}
	}
	return nil
}

// unsupported says why a capability is not supported, or "" when it is.
func unsupported(c *csi.VolumeCapability) string {
	if c.GetBlock() == nil && c.GetMount() == nil {
		return "a volume capability needs an access type (mount or block)"
	}
	// Refused here, not only when a node stages the volume: CreateVolume and
	// ValidateVolumeCapabilities must not promise a file system no node will make.
	if t := c.GetMount().GetFsType(); t != "" && !slices.Contains(fsTypes, t) {
		return fmt.Sprintf("file system type %q is not supported: use one of %s (default %s)", t, strings.Join(fsTypes, ", "), fsTypes[0])
	}
	switch c.GetAccessMode().GetMode() {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:
		return ""
	case csi.VolumeCapability_AccessMode_UNKNOWN:
		return "a volume capability needs an access mode"
	default:
		return fmt.Sprintf("access mode %s is not supported: a crdipc volume is used by one node at a time", c.GetAccessMode().GetMode())
	}
}

func csiVolume(vol *storagev1alpha1.CStorVolume) *csi.Volume {
	rf := vol.Spec.ReplicationFactor
	if rf == 0 {
		rf = storagev1alpha1.DefaultReplicationFactor
	}
	return &csi.Volume{
		VolumeId:      vol.Name,
		CapacityBytes: vol.Spec.Capacity.Value(),
		VolumeContext: map[string]string{
			ParamReplicaCount: strconv.Itoa(int(rf)),
			"namespace":       vol.Namespace,
		},
	}
}

// DeleteVolume implements csi.ControllerServer. A missing volume is success; a published
// one is refused with FailedPrecondition. It waits, within the deadline, for the operator's
// finalizer to remove the replicas, so success means the data is gone.
func (d *Driver) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	}
	if isInvalidName(req.GetVolumeId()) {
		return &csi.DeleteVolumeResponse{}, nil // no such volume can exist
	}
	vol := newVolume()
	if err := d.c.Get(ctx, d.volumeKey(req.GetVolumeId()), vol); apierrors.IsNotFound(err) {
		return &csi.DeleteVolumeResponse{}, nil
	} else if err != nil {
		return nil, apiError("reading volume", err)
	}
	if nodes := published(vol); len(nodes) > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is published to %s", vol.Name, strings.Join(sortedKeys(nodes), ", "))
	}
	if vol.DeletionTimestamp.IsZero() {
		// The precondition makes the delete fail if a ControllerPublish recorded a node in
		// between: the resourceVersion we checked must be the one we delete.
		err := d.c.Delete(ctx, vol, client.Preconditions{UID: &vol.UID, ResourceVersion: &vol.ResourceVersion})
		if apierrors.IsNotFound(err) {
			return &csi.DeleteVolumeResponse{}, nil
		}
		if apierrors.IsConflict(err) {
			return nil, status.Errorf(codes.Aborted, "volume %s changed while being deleted; retry", vol.Name)
		}
		if err != nil {
			return nil, apiError("deleting volume", err)
		}
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(d.o.CreateTimeout)
	}
	actx, cancel := context.WithDeadline(ctx, deadline.Add(-time.Until(deadline)/10))
	defer cancel()
	never := func(client.Object, ipc.Status) (bool, error) { return false, nil }
	err := ipc.Await(actx, d.c, vol, never)
	if errors.Is(err, ipc.ErrDeleted) || apierrors.IsNotFound(err) {
		return &csi.DeleteVolumeResponse{}, nil
	}
	return nil, status.Errorf(codes.Aborted, "volume %s is still being deleted (its replicas are being removed)", vol.Name)
}

func isInvalidName(id string) bool { return len(validation.IsDNS1123Subdomain(id)) > 0 }

// published returns the nodes the volume is published to, node → "rw" | "ro".
func published(vol *storagev1alpha1.CStorVolume) map[string]string {
	m := map[string]string{}
	if s := vol.Annotations[AnnotationPublished]; s != "" {
		_ = json.Unmarshal([]byte(s), &m)
	}
	return m
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// ControllerPublishVolume implements csi.ControllerServer. It records the node on the volume
// (so DeleteVolume can refuse); publishing again to the same node with the same mode is a
// no-op, to another node FailedPrecondition, since a crdipc volume serves one node.
func (d *Driver) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	case req.GetNodeId() == "":
		return nil, status.Error(codes.InvalidArgument, "node id is required")
	case req.GetVolumeCapability() == nil:
		return nil, status.Error(codes.InvalidArgument, "volume capability is required")
	}
	if msg := unsupported(req.GetVolumeCapability()); msg != "" {
		return nil, status.Error(codes.InvalidArgument, msg)
	}
	mode := "rw"
	if req.GetReadonly() || req.GetVolumeCapability().GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY {
		mode = "ro"
	}
	if isInvalidName(req.GetVolumeId()) {
		return nil, status.Errorf(codes.NotFound, "volume %s not found", req.GetVolumeId())
	}
	if err := d.nodeExists(ctx, req.GetNodeId()); err != nil {
		return nil, err
	}
	d.publishMu.Lock()
	defer d.publishMu.Unlock()
	err := d.updatePublished(ctx, req.GetVolumeId(), func(vol *storagev1alpha1.CStorVolume, nodes map[string]string) (bool, error) {
		if !vol.DeletionTimestamp.IsZero() {
			return false, status.Errorf(codes.NotFound, "volume %s is being deleted", vol.Name)
		}
		if m, ok := nodes[req.GetNodeId()]; ok {
			if m != mode {
				return false, status.Errorf(codes.AlreadyExists, "volume %s is published to %s as %s, not %s", vol.Name, req.GetNodeId(), m, mode)
			}
			return false, nil
		}
		if len(nodes) > 0 {
			return false, status.Errorf(codes.FailedPrecondition, "volume %s is published to %s; it can be used by one node at a time", vol.Name, strings.Join(sortedKeys(nodes), ", "))
		}
		nodes[req.GetNodeId()] = mode
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	return &csi.ControllerPublishVolumeResponse{PublishContext: map[string]string{"node": req.GetNodeId(), "mode": mode}}, nil
}

// ControllerUnpublishVolume implements csi.ControllerServer. A volume or node that is not
// published counts as unpublished: OK. An empty node ID unpublishes every node.
func (d *Driver) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	}
	if isInvalidName(req.GetVolumeId()) {
		return &csi.ControllerUnpublishVolumeResponse{}, nil
	}
	d.publishMu.Lock()
	defer d.publishMu.Unlock()
	err := d.updatePublished(ctx, req.GetVolumeId(), func(_ *storagev1alpha1.CStorVolume, nodes map[string]string) (bool, error) {
		if req.GetNodeId() == "" {
			changed := len(nodes) > 0
			clear(nodes)
			return changed, nil
		}
		if _, ok := nodes[req.GetNodeId()]; !ok {
			return false, nil
		}
		delete(nodes, req.GetNodeId())
		return true, nil
	})
	if status.Code(err) == codes.NotFound {
		return &csi.ControllerUnpublishVolumeResponse{}, nil
	}
	if err != nil {
		return nil, err
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}

// updatePublished applies change to the volume's published nodes and writes them back with
// an optimistic lock, retrying on conflicts.
func (d *Driver) updatePublished(ctx context.Context, id string, change func(*storagev1alpha1.CStorVolume, map[string]string) (bool, error)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		vol := newVolume()
		if err := d.c.Get(ctx, d.volumeKey(id), vol); apierrors.IsNotFound(err) {
			return status.Errorf(codes.NotFound, "volume %s not found", id)
		} else if err != nil {
			return apiError("reading volume", err)
		}
		nodes := published(vol)
		changed, err := change(vol, nodes)
		if err != nil || !changed {
			return err
		}
		patch := client.MergeFromWithOptions(vol.DeepCopy(), client.MergeFromWithOptimisticLock{})
		if len(nodes) == 0 {
			delete(vol.Annotations, AnnotationPublished)
		} else {
			data, err := json.Marshal(nodes)
			if err != nil {
				return status.Errorf(codes.Internal, "encoding published nodes: %v", err)
			}
			if vol.Annotations == nil {
				vol.Annotations = map[string]string{}
			}
			vol.Annotations[AnnotationPublished] = string(data)
		}
		err = d.c.Patch(ctx, vol, patch)
		if apierrors.IsConflict(err) {
			return err
		}
		if err != nil {
			return apiError("recording published nodes", err)
		}
		return nil
	})
}

// nodeExists: a node is known to the driver when it has a storage pool. The driver has no
// access to Node objects, and a node without a pool cannot hold a crdipc replica anyway.
func (d *Driver) nodeExists(ctx context.Context, node string) error {
	var pools storagev1alpha1.CStorPoolList
	if err := d.c.List(ctx, &pools, client.MatchingFields{storagev1alpha1.FieldNodeName: node}, client.Limit(1)); err != nil {
		return apiError("listing pools", err)
	}
	if len(pools.Items) == 0 {
		return status.Errorf(codes.NotFound, "node %s has no crdipc storage pool", node)
	}
	return nil
}

// ValidateVolumeCapabilities implements csi.ControllerServer.
func (d *Driver) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume capabilities are required")
	}
	if isInvalidName(req.GetVolumeId()) {
		return nil, status.Errorf(codes.NotFound, "volume %s not found", req.GetVolumeId())
	}
	vol := newVolume()
	if err := d.c.Get(ctx, d.volumeKey(req.GetVolumeId()), vol); apierrors.IsNotFound(err) {
		return nil, status.Errorf(codes.NotFound, "volume %s not found", req.GetVolumeId())
	} else if err != nil {
		return nil, apiError("reading volume", err)
	}
	for _, c := range req.GetVolumeCapabilities() {
		if msg := unsupported(c); msg != "" {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: msg}, nil
		}
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// tokenPrefix marks ListVolumes tokens; anything else is an invalid token (Aborted).
const tokenPrefix = "v1."

// ListVolumes implements csi.ControllerServer. Volumes are returned in name order and the
// token is the last name returned, so volumes created or deleted between pages neither
// repeat nor shift the next page.
func (d *Driver) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, status.Error(codes.InvalidArgument, "max_entries must not be negative")
	}
	after := ""
	if t := req.GetStartingToken(); t != "" {
		raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(t, tokenPrefix))
		if !strings.HasPrefix(t, tokenPrefix) || err != nil {
			return nil, status.Errorf(codes.Aborted, "invalid starting token %q", t)
		}
		after = string(raw)
	}
	var l storagev1alpha1.CStorVolumeList
	if err := d.c.List(ctx, &l, client.InNamespace(d.o.Namespace)); err != nil {
		return nil, apiError("listing volumes", err)
	}
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Name < l.Items[j].Name })
	resp := &csi.ListVolumesResponse{}
	for i := range l.Items {
		vol := &l.Items[i]
		if vol.Name <= after || !vol.DeletionTimestamp.IsZero() {
			continue
		}
		if req.GetMaxEntries() > 0 && len(resp.Entries) == int(req.GetMaxEntries()) {
			resp.NextToken = tokenPrefix + base64.RawURLEncoding.EncodeToString([]byte(resp.Entries[len(resp.Entries)-1].Volume.VolumeId))
			break
		}
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{
			Volume: csiVolume(vol),
			Status: &csi.ListVolumesResponse_VolumeStatus{PublishedNodeIds: sortedKeys(published(vol))},
		})
	}
	return resp, nil
}

// GetCapacity implements csi.ControllerServer: the largest volume that fits now, given the
// replica count — each replica needs that much free space on a distinct node's Healthy pool.
func (d *Driver) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	for _, c := range req.GetVolumeCapabilities() {
		if msg := unsupported(c); msg != "" {
			return &csi.GetCapacityResponse{}, nil
		}
	}
	rf, _, err := parseParameters(req.GetParameters())
	if err != nil {
		return nil, err
	}
	var pools storagev1alpha1.CStorPoolList
	if err := d.c.List(ctx, &pools); err != nil {
		return nil, apiError("listing pools", err)
	}
	// The most free space per node: replicas go to distinct nodes.
	perNode := map[string]int64{}
	for _, p := range pools.Items {
		if p.Status.Phase != storagev1alpha1.PoolPhaseHealthy || p.Status.Capacity == nil || !p.DeletionTimestamp.IsZero() {
			continue
		}
		if free := p.Status.Capacity.Free.Value(); free > perNode[p.Spec.NodeName] {
			perNode[p.Spec.NodeName] = free
		}
	}
	frees := make([]int64, 0, len(perNode))
	for _, f := range perNode {
		frees = append(frees, f)
	}
	sort.Slice(frees, func(i, j int) bool { return frees[i] > frees[j] })
	var avail int64
	if len(frees) >= int(rf) {
		avail = frees[rf-1]
	}
	return &csi.GetCapacityResponse{AvailableCapacity: avail}, nil
}

// apiError maps an API server error to a gRPC status: transient ones to retryable codes, so
// the sidecar retries them, the rest to Internal.
func apiError(what string, err error) error {
	switch {
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
		return status.Errorf(codes.PermissionDenied, "%s: %v", what, err)
	case apierrors.IsTooManyRequests(err), apierrors.IsServerTimeout(err), apierrors.IsTimeout(err),
		apierrors.IsServiceUnavailable(err), apierrors.IsInternalError(err):
		return status.Errorf(codes.Unavailable, "%s: %v", what, err)
	case apierrors.IsConflict(err):
		return status.Errorf(codes.Aborted, "%s: %v", what, err)
	case errors.Is(err, context.DeadlineExceeded):
		return status.Errorf(codes.DeadlineExceeded, "%s: %v", what, err)
	case errors.Is(err, context.Canceled):
		return status.Errorf(codes.Canceled, "%s: %v", what, err)
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return status.Errorf(codes.InvalidArgument, "%s: %v", what, err)
	}
	var se apierrors.APIStatus
	if !errors.As(err, &se) {
		// Not an answer from the API server: it is unreachable.
		return status.Errorf(codes.Unavailable, "%s: %v", what, err)
	}
	return status.Errorf(codes.Internal, "%s: %v", what, err)
}
