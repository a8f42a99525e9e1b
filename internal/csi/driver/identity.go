package driver

import (
	"context"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
)

// GetPluginInfo implements csi.IdentityServer.
func (d *Driver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: Name, VendorVersion: crdipc.Version()}, nil
}

// GetPluginCapabilities implements csi.IdentityServer.
func (d *Driver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{
		{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}}},
		// A volume grows while it is staged and in use: the replicas, then the target and
		// the file system on the node (ControllerExpandVolume, NodeExpandVolume).
		{Type: &csi.PluginCapability_VolumeExpansion_{VolumeExpansion: &csi.PluginCapability_VolumeExpansion{Type: csi.PluginCapability_VolumeExpansion_ONLINE}}},
	}}, nil
}

// Probe implements csi.IdentityServer. The driver is ready when it can list CStorVolumes:
// the API server answers, the CRD is served and the driver's permissions are in place.
func (d *Driver) Probe(ctx context.Context, _ *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	d.probe.Lock()
	defer d.probe.Unlock()
	if time.Since(d.probe.at) > time.Second {
		var l storagev1alpha1.CStorVolumeList
		err := d.c.List(ctx, &l, client.InNamespace(d.o.Namespace), client.Limit(1))
		if err != nil {
			d.log.Info("probe: not ready", "error", err.Error())
		}
		d.probe.at, d.probe.ready = time.Now(), err == nil
	}
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(d.probe.ready)}, nil
}
