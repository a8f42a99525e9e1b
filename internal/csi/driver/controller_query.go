package driver

import (
	"context"
	"encoding/base64"
	"sort"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
)

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

// pageAfter is the name a starting token says the last page ended with; "" for none.
func pageAfter(token string) (string, error) {
	if token == "" {
		return "", nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(token, tokenPrefix))
	if !strings.HasPrefix(token, tokenPrefix) || err != nil {
		return "", status.Errorf(codes.Aborted, "invalid starting token %q", token)
	}
	return string(raw), nil
}

// pageToken is the token of a page that ended with name.
func pageToken(name string) string {
	return tokenPrefix + base64.RawURLEncoding.EncodeToString([]byte(name))
}

// ListVolumes implements csi.ControllerServer. Volumes are returned in name order and the
// token is the last name returned, so volumes created or deleted between pages neither
// repeat nor shift the next page.
func (d *Driver) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, status.Error(codes.InvalidArgument, "max_entries must not be negative")
	}
	after, err := pageAfter(req.GetStartingToken())
	if err != nil {
		return nil, err
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
			resp.NextToken = pageToken(resp.Entries[len(resp.Entries)-1].Volume.VolumeId)
			break
		}
		v, err := csiVolume(vol)
		if err != nil {
			return nil, err
		}
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{
			Volume: v,
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
		// A free space beyond an int64 (none the agents report) is skipped, not wrapped.
		if free, err := storagev1alpha1.Bytes(p.Status.Capacity.Free); err == nil && free > perNode[p.Spec.NodeName] {
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
