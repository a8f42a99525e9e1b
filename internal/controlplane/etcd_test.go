package controlplane_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/crdipc/crdipc/internal/testenv"
)

// TestEtcdAdmitsOnlyTheAPIServer: etcd holds every object, Secrets included, on a loopback
// port any local user can reach. Without a certificate of etcd's own CA — none at all, or
// the cluster admin's — it refuses; with the API server's etcd client certificate it serves.
func TestEtcdAdmitsOnlyTheAPIServer(t *testing.T) {
	env := testenv.Get(t)
	pki := filepath.Join(env.DataDir(), "pki")
	roots := x509.NewCertPool()
	ca, err := os.ReadFile(filepath.Join(pki, "etcd-ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	roots.AppendCertsFromPEM(ca)
	pair := func(name string) []tls.Certificate {
		c, err := tls.LoadX509KeyPair(filepath.Join(pki, name+".crt"), filepath.Join(pki, name+".key"))
		if err != nil {
			t.Fatal(err)
		}
		return []tls.Certificate{c}
	}
	get := func(cfg *tls.Config) error {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{env.EtcdURL()}, TLS: cfg, DialTimeout: 2 * time.Second})
		if err != nil {
			return err
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err = cli.Get(ctx, "/registry/secrets", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err
	}
	for name, cfg := range map[string]*tls.Config{
		"no client certificate":                  {RootCAs: roots},
		"the cluster admin's client certificate": {RootCAs: roots, Certificates: pair("admin")},
	} {
		if err := get(cfg); err == nil {
			t.Errorf("etcd served a client with %s", name)
		}
	}
	plain, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + env.EtcdURL()[len("https://"):]}, DialTimeout: 2 * time.Second})
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_, err = plain.Get(ctx, "/registry", clientv3.WithPrefix(), clientv3.WithCountOnly())
		cancel()
		plain.Close()
	}
	if err == nil {
		t.Error("etcd served a plain-HTTP client")
	}
	if err := get(&tls.Config{RootCAs: roots, Certificates: pair("apiserver-etcd-client")}); err != nil {
		t.Errorf("etcd refused the API server's client certificate: %v", err)
	}
}
