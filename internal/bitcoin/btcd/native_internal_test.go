package btcd

import (
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// A btcd pod's own command line runs as is, but for what its namespaces would give it:
// wildcard listeners bound to the pod IP, paths outside its mounted volumes (and HOME) in
// the pod's directory.
func TestNativeImageCommand(t *testing.T) {
	dir := t.TempDir()
	c := &corev1.Container{
		Command: []string{"btcd"},
		Args: []string{"--regtest", "--listen=:18444", "--rpclisten=0.0.0.0:18334", "--rpclisten=10.0.0.9:1",
			"--rpcuser=u", "--rpcpass=p", "--datadir=/data/chain", "--logdir=/var/log/btcd"},
		VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
	}
	p, err := NativeImage{Binary: "/usr/local/bin/btcd"}.Command(&corev1.Pod{}, c, "127.2.0.7", map[string]string{"HOME": "/data", "RPC_USER": "u"}, dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/usr/local/bin/btcd", "--regtest", "--listen=127.2.0.7:18444", "--rpclisten=127.2.0.7:18334", "--rpclisten=10.0.0.9:1",
		"--rpcuser=u", "--rpcpass=p", "--datadir=/data/chain", "--logdir=" + filepath.Join(dir, "var/log/btcd")}
	if !slices.Equal(p.Cmd.Args, want) {
		t.Errorf("args\n%v\nwant\n%v", p.Cmd.Args, want)
	}
	if !slices.Equal(p.Cmd.Env, []string{"HOME=/data", "RPC_USER=u"}) {
		t.Errorf("env %v, want HOME on the mounted volume", p.Cmd.Env)
	}
	if len(p.Forward) != 0 {
		t.Errorf("forwards %v: btcd listens on the pod IP itself", p.Forward)
	}

	// Without the mount (no mount namespace), HOME moves into the pod's directory.
	c.VolumeMounts = nil
	p, err = NativeImage{Binary: "/usr/local/bin/btcd"}.Command(&corev1.Pod{}, c, "127.2.0.7", map[string]string{"HOME": "/data"}, dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.Cmd.Env, []string{"HOME=" + filepath.Join(dir, "data")}) || !slices.Contains(p.Cmd.Args, "--datadir="+filepath.Join(dir, "data/chain")) {
		t.Errorf("without the volume mounted: env %v, args %v", p.Cmd.Env, p.Cmd.Args)
	}
}
