package driver

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/crdipc/crdipc/internal/scheme"
)

// serve serves d on a socket in dir and returns the socket's path.
func serve(t *testing.T, d *Driver, dir string) string {
	t.Helper()
	sock := filepath.Join(dir, "csi.sock")
	l, err := Listen("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- d.ServeListener(ctx, l) }()
	t.Cleanup(func() { cancel(); <-served })
	return sock
}

// A controller instance with a node relay answers Node calls with the node plugin's
// answers, errors as they came; a relay to a node plugin that does not run says which.
func TestNodeRelay(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).Build()
	root := t.TempDir()
	node, err := New(Options{Client: c, NodeID: "node-1", TargetDir: t.TempDir(), KubeletRoot: root, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	node.host = refusingHost(t)
	nodeSock := serve(t, node, t.TempDir())
	missing := filepath.Join(t.TempDir(), "csi.sock")

	for _, tc := range []struct{ name, relay string }{{"running", nodeSock}, {"missing", missing}} {
		ctrl, err := New(Options{Client: c, NodeRelay: "unix://" + tc.relay, Registerer: prometheus.NewRegistry()})
		if err != nil {
			t.Fatal(err)
		}
		sock := serve(t, ctrl, t.TempDir())
		conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		nc := csi.NewNodeClient(conn)
		info, err := nc.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
		_, pubErr := nc.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol", TargetPath: "/etc/target"})
		switch tc.name {
		case "running":
			if err != nil || info.GetNodeId() != "node-1" {
				t.Errorf("NodeGetInfo through the relay: %v, %v; want node-1", info, err)
			}
			// The node plugin's own refusal, naming its kubelet root.
			if status.Code(pubErr) != codes.InvalidArgument || !strings.Contains(pubErr.Error(), root) {
				t.Errorf("NodeUnpublishVolume outside the kubelet root through the relay: %v, want the node plugin's InvalidArgument", pubErr)
			}
		case "missing":
			for _, err := range []error{err, pubErr} {
				if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), missing) {
					t.Errorf("Node call relayed to no node plugin: %v, want Unavailable naming %s", err, missing)
				}
			}
		}
		// The controller's own services stay its own.
		if _, err := csi.NewControllerClient(conn).CreateVolume(ctx, &csi.CreateVolumeRequest{}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("CreateVolume without a name on the relaying socket: %v, want InvalidArgument", err)
		}
	}
}
