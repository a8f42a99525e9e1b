package driver

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/validation"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
)

// compatible reports ALREADY_EXISTS when an existing volume does not match the request.
func compatible(vol *storagev1alpha1.CStorVolume, req *csi.CreateVolumeRequest, size int64, rf int32, cf *int32) error {
	if n, ok := vol.Annotations[AnnotationName]; !ok {
		return status.Errorf(codes.AlreadyExists, "volume id %s is taken by a CStorVolume the driver did not create (no %s annotation)", vol.Name, AnnotationName)
	} else if n != req.GetName() {
		return status.Errorf(codes.AlreadyExists, "volume id %s belongs to volume name %q", vol.Name, n)
	}
	have, err := storagev1alpha1.Bytes(vol.Spec.Capacity)
	if err != nil {
		return status.Errorf(codes.AlreadyExists, "volume %q exists with capacity %s, incompatible with the request: %v", req.GetName(), vol.Spec.Capacity.String(), err)
	}
	r := req.GetCapacityRange()
	if have < r.GetRequiredBytes() || (r.GetLimitBytes() > 0 && have > r.GetLimitBytes()) || (r == nil && have != size) {
		return status.Errorf(codes.AlreadyExists, "volume %q exists with capacity %d bytes, incompatible with the request", req.GetName(), have)
	}
	if haveRF := vol.Spec.EffectiveReplicationFactor(); haveRF != rf {
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
		case k == ParamBackup:
			// The content source, read by backupSource.
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
	if msg := checkMountFlags(c.GetMount().GetMountFlags()); msg != "" {
		return msg
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

func isInvalidName(id string) bool { return len(validation.IsDNS1123Subdomain(id)) > 0 }
