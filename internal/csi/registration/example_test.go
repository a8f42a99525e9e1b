package registration_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/crdipc/crdipc/internal/csi/registration"
)

// A Server answers the kubelet's GetInfo on its socket in the registration directory: a
// CSI plugin, its name, the host path of its CSI socket and the CSI versions it speaks.
func Example() {
	dir, _ := os.MkdirTemp("", "reg")
	defer os.RemoveAll(dir)
	s, err := registration.New(registration.Options{
		Dir:      dir, // the kubelet's: /var/lib/kubelet/plugins_registry
		Name:     "csi.crdipc.io",
		Endpoint: "/var/lib/kubelet/plugins/csi.crdipc.io/csi.sock",
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Start(ctx) }()
	defer func() { cancel(); <-done }()

	// What the kubelet does once its watcher sees the socket.
	conn, err := grpc.NewClient("unix://"+s.SocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close()
	call, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	info, err := registerapi.NewRegistrationClient(conn).GetInfo(call, &registerapi.InfoRequest{}, grpc.WaitForReady(true))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(filepath.Base(s.SocketPath()))
	fmt.Println(info.Type, info.Name, info.Endpoint, info.SupportedVersions)
	// Output:
	// csi.crdipc.io-reg.sock
	// CSIPlugin csi.crdipc.io /var/lib/kubelet/plugins/csi.crdipc.io/csi.sock [1.0.0]
}
