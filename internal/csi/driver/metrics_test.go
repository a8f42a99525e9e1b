package driver

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/crdipc/crdipc/internal/scheme"
	testmetrics "github.com/crdipc/crdipc/internal/testenv/metrics"
)

// A unit test with the fake client: the calls go over a real Unix socket, the metrics are
// read back through the HTTP handler and a real exposition-format parser.
func TestMetricsAndProbes(t *testing.T) {
	reg := prometheus.NewRegistry()
	d, err := New(Options{Client: fake.NewClientBuilder().WithScheme(scheme.Scheme).Build(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "csi.sock")
	ctx, cancel := context.WithCancel(context.Background())
	// Listen before serving, so the socket exists when the first call dials.
	l, err := Listen("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- d.ServeListener(ctx, l) }()
	t.Cleanup(func() { cancel(); <-served })
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	if _, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		_, err := csi.NewControllerClient(conn).CreateVolume(ctx, &csi.CreateVolumeRequest{})
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("CreateVolume without a name: %v, want InvalidArgument", err)
		}
	}

	srv := httptest.NewServer(d.Handler(reg))
	defer srv.Close()
	mfs := testmetrics.Scrape(t, srv.URL+"/metrics")
	for _, tc := range []struct {
		method, code string
		want         float64
	}{{"GetPluginInfo", "OK", 1}, {"CreateVolume", "InvalidArgument", 2}} {
		labels := map[string]string{"method": tc.method, "grpc_status_code": tc.code}
		if n, _ := mfs.Sample("crdipc_csi_operations_seconds_count", labels); n != tc.want {
			t.Errorf("crdipc_csi_operations_seconds_count%v = %v, want %v; all:\n%s", labels, n, tc.want, mfs.Format("crdipc_csi_operations_seconds_count"))
		}
	}
	if code, _ := get(t, srv.URL+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d", code)
	}
	if code, body := get(t, srv.URL+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz = %d %s, want 200: the driver can list CStorVolumes", code, body)
	}

	// A driver that cannot list CStorVolumes (here: its client does not know the kind) is
	// not ready, and says why.
	blind, err := New(Options{Client: fake.NewClientBuilder().WithScheme(runtime.NewScheme()).Build(), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	blind.Handler(prometheus.NewRegistry()).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "cannot list CStorVolumes") {
		t.Errorf("/readyz of a driver that cannot list = %d %q, want 503 with the reason", rec.Code, rec.Body.String())
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}
