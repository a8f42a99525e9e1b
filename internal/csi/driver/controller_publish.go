package driver

import (
	"context"
	"encoding/json"
	"sort"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
)

// published returns the nodes the volume is published to, node → "rw" | "ro".
func published(vol *storagev1alpha1.CStorVolume) map[string]string {
	return storagev1alpha1.PublishedNodes(vol)
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
