package controlplane

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
)

type etcdServer struct {
	e         *embed.Etcd
	clientURL string
}

// startEtcd runs a single-member etcd on loopback ports chosen by the kernel.
// Raft timings are shortened: with the defaults a lone member waits a random
// 0.1–1 s to elect itself, which dominated `crdipc up`'s start time.
//
// Clients need a certificate of etcd's own CA (client-certificate TLS on both the client and
// the peer listener): etcd holds every object, Secrets included, and any local user — any
// pod process up runs — can reach loopback; only the API server, which enforces RBAC, may.
func startEtcd(ctx context.Context, dir, logFile string, p pki) (*etcdServer, error) {
	cfg := embed.NewConfig()
	cfg.Name = "crdipc"
	cfg.Dir = dir
	cfg.TickMs = 10
	cfg.ElectionMs = 100
	loopback := url.URL{Scheme: "https", Host: "127.0.0.1:0"}
	tls := transport.TLSInfo{
		CertFile:       p.etcdServerCert,
		KeyFile:        p.etcdServerKey,
		TrustedCAFile:  p.etcdCACert,
		ClientCertAuth: true,
	}
	cfg.ClientTLSInfo, cfg.PeerTLSInfo = tls, tls
	cfg.ListenClientUrls = []url.URL{loopback}
	cfg.AdvertiseClientUrls = []url.URL{loopback}
	cfg.ListenPeerUrls = []url.URL{loopback}
	cfg.AdvertisePeerUrls = []url.URL{loopback}
	cfg.InitialCluster = cfg.Name + "=" + loopback.String()
	cfg.LogLevel = "warn"
	cfg.LogOutputs = []string{logFile}
	// Keep history bounded, as kube-apiserver's own compactor would on a
	// real cluster: revisions older than an hour are compacted.
	cfg.AutoCompactionMode = embed.CompactorModePeriodic
	cfg.AutoCompactionRetention = "1h"
	cfg.EnableGRPCGateway = false

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("starting etcd in %s: %w", dir, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("etcd failed: %w", err)
	case <-time.After(time.Minute):
		e.Close()
		return nil, fmt.Errorf("etcd did not become ready within a minute")
	case <-ctx.Done():
		e.Close()
		return nil, ctx.Err()
	}
	return &etcdServer{e: e, clientURL: "https://" + e.Clients[0].Addr().String()}, nil
}

func (s *etcdServer) close() { s.e.Close() }
