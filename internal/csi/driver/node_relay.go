package driver

import (
	"context"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// nodeRelay serves another instance's Node service (Options.NodeRelay) as this socket's:
// every call goes to that node plugin as it came, and its answer, error code and message
// included, comes back unchanged. The node plugin does the work with its own identity.
type nodeRelay struct {
	csi.UnimplementedNodeServer
	endpoint string
	conn     *grpc.ClientConn
	c        csi.NodeClient
}

func newNodeRelay(endpoint string) (*nodeRelay, error) {
	path, err := SocketPath(endpoint)
	if err != nil {
		return nil, fmt.Errorf("csi driver: node relay: %w", err)
	}
	// grpc.NewClient does not connect: the node plugin may start after this socket.
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithAuthority("localhost"))
	if err != nil {
		return nil, fmt.Errorf("csi driver: node relay to %s: %w", path, err)
	}
	return &nodeRelay{endpoint: path, conn: conn, c: csi.NewNodeClient(conn)}, nil
}

func (r *nodeRelay) close() { _ = r.conn.Close() }

// relayed returns the node plugin's answer; a node plugin that does not answer at all is
// named, so that Unavailable does not read as this socket's own failure.
func relayed[T any](r *nodeRelay, resp T, err error) (T, error) {
	if s, ok := status.FromError(err); ok && s.Code() == codes.Unavailable {
		return resp, status.Errorf(codes.Unavailable, "this socket relays Node calls to the node plugin at %s, which does not answer: %s", r.endpoint, s.Message())
	}
	return resp, err
}

func (r *nodeRelay) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	resp, err := r.c.NodeStageVolume(ctx, req)
	return relayed(r, resp, err)
}

func (r *nodeRelay) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	resp, err := r.c.NodeUnstageVolume(ctx, req)
	return relayed(r, resp, err)
}

func (r *nodeRelay) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	resp, err := r.c.NodePublishVolume(ctx, req)
	return relayed(r, resp, err)
}

func (r *nodeRelay) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	resp, err := r.c.NodeUnpublishVolume(ctx, req)
	return relayed(r, resp, err)
}

func (r *nodeRelay) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	resp, err := r.c.NodeGetVolumeStats(ctx, req)
	return relayed(r, resp, err)
}

func (r *nodeRelay) NodeGetVolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	resp, err := r.c.NodeGetVolumeHealth(ctx, req)
	return relayed(r, resp, err)
}

func (r *nodeRelay) NodeGetStorageHealth(ctx context.Context, req *csi.NodeGetStorageHealthRequest) (*csi.NodeGetStorageHealthResponse, error) {
	resp, err := r.c.NodeGetStorageHealth(ctx, req)
	return relayed(r, resp, err)
}

func (r *nodeRelay) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	resp, err := r.c.NodeExpandVolume(ctx, req)
	return relayed(r, resp, err)
}

func (r *nodeRelay) NodeGetCapabilities(ctx context.Context, req *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	resp, err := r.c.NodeGetCapabilities(ctx, req)
	return relayed(r, resp, err)
}

func (r *nodeRelay) NodeGetInfo(ctx context.Context, req *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	resp, err := r.c.NodeGetInfo(ctx, req)
	return relayed(r, resp, err)
}
