package registration

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/crdipc/crdipc/internal/unixsocket"
)

// SupportedVersions are the CSI versions the driver speaks, as GetInfo reports them. The
// kubelet accepts any 1.x (CSI 1.x releases are backwards compatible).
var SupportedVersions = []string{"1.0.0"}

// Options configure a Server.
type Options struct {
	// Dir is the directory the kubelet watches for registration sockets (its
	// plugins_registry). It must exist: the kubelet creates it, and a directory made here
	// would be one the kubelet does not watch.
	Dir string
	// Name is the CSI driver's name (driver.Name), which the kubelet keys the plugin by.
	Name string
	// Endpoint is the absolute path of the driver's CSI socket on the host, which the
	// kubelet dials.
	Endpoint string
	// CSIEndpoint is the same socket as this process reaches it (unix:///path or an absolute
	// path). When set, Start waits until it answers GetPluginInfo with Name before it
	// offers the driver to the kubelet.
	CSIEndpoint string
	// Logger; default the controller-runtime global logger.
	Logger *logr.Logger
}

// Status is what the kubelet last said of the registration (NotifyRegistrationStatus).
type Status struct {
	// At is when the kubelet said it; zero: it has not yet.
	At time.Time
	// Registered is true when the kubelet accepted the driver.
	Registered bool
	// Error is the kubelet's reason for a refusal.
	Error string
}

// Server serves the kubelet's Registration service for one CSI driver. It serves one Start
// at a time; a Start after another returned serves anew.
type Server struct {
	registerapi.UnimplementedRegistrationServer

	o    Options
	path string
	log  logr.Logger

	mu     sync.Mutex
	status Status
	// socket is the registration socket while Start serves it; nil otherwise.
	socket *unixsocket.Listener
}

// New returns a Server; it creates nothing until Start.
func New(o Options) (*Server, error) {
	switch {
	case o.Dir == "":
		return nil, errors.New("csi registration: the registration directory is required")
	case o.Name == "":
		return nil, errors.New("csi registration: the driver name is required")
	case !filepath.IsAbs(o.Endpoint):
		return nil, fmt.Errorf("csi registration: the kubelet's endpoint %q is not an absolute path", o.Endpoint)
	}
	if o.CSIEndpoint != "" && !filepath.IsAbs(strings.TrimPrefix(o.CSIEndpoint, "unix://")) {
		return nil, fmt.Errorf("csi registration: CSI endpoint %q is not an absolute path", o.CSIEndpoint)
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, fmt.Errorf("csi registration: %w", err)
	}
	l := log.Log.WithName("csi-registration")
	if o.Logger != nil {
		l = *o.Logger
	}
	o.Endpoint = filepath.Clean(o.Endpoint)
	return &Server{o: o, path: filepath.Join(dir, o.Name+"-reg.sock"), log: l}, nil
}

// SocketPath is the registration socket: <dir>/<name>-reg.sock.
func (s *Server) SocketPath() string { return s.path }

// NeedLeaderElection implements manager.LeaderElectionRunnable: every node registers.
func (s *Server) NeedLeaderElection() bool { return false }

// Start implements manager.Runnable: once the driver answers (Options.CSIEndpoint), it
// serves the registration socket until ctx ends, then removes it, so the kubelet
// deregisters the driver.
func (s *Server) Start(ctx context.Context) error {
	if s.o.CSIEndpoint != "" {
		if err := s.awaitDriver(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	if _, err := os.Stat(filepath.Dir(s.path)); err != nil {
		return fmt.Errorf("csi registration: the kubelet's registration directory: %w", err)
	}
	// A socket left by a run that did not stop cleanly (a crash, SIGKILL) is replaced.
	l, err := unixsocket.Listen(s.path)
	if err != nil {
		return fmt.Errorf("csi registration: %w", err)
	}
	s.mu.Lock()
	s.status, s.socket = Status{}, l
	s.mu.Unlock()

	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, s)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	s.log.Info("offering the driver to the kubelet", "socket", s.path, "driver", s.o.Name, "endpoint", s.o.Endpoint)
	select {
	case err = <-errc:
		err = fmt.Errorf("csi registration: serving: %w", err)
	case <-ctx.Done():
	}
	// The socket first: its removal is what makes the kubelet deregister the driver.
	s.removeSocket()
	srv.Stop()
	return err
}

// removeSocket removes the registration socket unless another run has replaced it since.
func (s *Server) removeSocket() {
	s.mu.Lock()
	l := s.socket
	s.socket = nil
	s.mu.Unlock()
	if err := l.Remove(); err != nil {
		s.log.Error(err, "removing the registration socket", "socket", s.path)
	}
}

// awaitDriver returns once the driver's CSI socket answers GetPluginInfo with its name: the
// kubelet calls NodeGetInfo as soon as it registers the driver.
func (s *Server) awaitDriver(ctx context.Context) error {
	target := s.o.CSIEndpoint
	if !strings.HasPrefix(target, "unix://") {
		target = "unix://" + target
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithAuthority("localhost"),
		// Retry connecting at least every second, not gRPC's up to two minutes.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, MaxDelay: time.Second}, MinConnectTimeout: time.Second}))
	if err != nil {
		return fmt.Errorf("csi registration: %w", err)
	}
	defer conn.Close()
	identity := csi.NewIdentityClient(conn)
	for {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		info, err := identity.GetPluginInfo(actx, &csi.GetPluginInfoRequest{}, grpc.WaitForReady(true))
		cancel()
		switch {
		case err == nil && info.GetName() != s.o.Name:
			return fmt.Errorf("csi registration: the driver at %s is %q, not %q", s.o.CSIEndpoint, info.GetName(), s.o.Name)
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		}
		s.log.Info("waiting for the driver's CSI socket before registering with the kubelet", "endpoint", s.o.CSIEndpoint, "error", err.Error())
	}
}

// GetInfo implements the kubelet's Registration service: a CSI plugin, its name, where the
// kubelet reaches it and the CSI versions it speaks.
func (s *Server) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	s.log.V(1).Info("the kubelet asks for the plugin's info", "socket", s.path)
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              s.o.Name,
		Endpoint:          s.o.Endpoint,
		SupportedVersions: SupportedVersions,
	}, nil
}

// NotifyRegistrationStatus implements the kubelet's Registration service: the kubelet's
// verdict, kept for Status and Check.
func (s *Server) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	s.mu.Lock()
	s.status = Status{At: time.Now(), Registered: st.GetPluginRegistered(), Error: st.GetError()}
	s.mu.Unlock()
	if st.GetPluginRegistered() {
		s.log.Info("registered with the kubelet", "driver", s.o.Name, "endpoint", s.o.Endpoint)
	} else {
		s.log.Error(errors.New(st.GetError()), "the kubelet refused the driver; the health check fails until it accepts it", "driver", s.o.Name, "endpoint", s.o.Endpoint)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// Status returns what the kubelet last said of the registration in the current (or last)
// Start.
func (s *Server) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status
}

// Check fails when the kubelet refused the driver the last time it answered, or when the
// registration socket has been removed or replaced while Start serves it. It does not fail
// before the kubelet answers: a node plugin may start before its kubelet does.
func (s *Server) Check() error {
	s.mu.Lock()
	st, l := s.status, s.socket
	s.mu.Unlock()
	if !st.At.IsZero() && !st.Registered {
		return fmt.Errorf("the kubelet refused driver %s: %s", s.o.Name, st.Error)
	}
	if l != nil && !l.Current() {
		return fmt.Errorf("the registration socket %s was removed: the kubelet will not find driver %s again", s.path, s.o.Name)
	}
	return nil
}

// Healthz wraps next, the driver's HTTP handler, so that its /healthz fails (500) while
// Check does; everything else is next's.
func (s *Server) Healthz(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			if err := s.Check(); err != nil {
				http.Error(w, "unhealthy: "+err.Error(), http.StatusInternalServerError)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}
