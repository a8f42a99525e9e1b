package podsim

import "testing"

func TestRepository(t *testing.T) {
	for ref, want := range map[string]string{
		"bitcoin/bitcoin":                       "docker.io/bitcoin/bitcoin",
		"bitcoin/bitcoin:28.1":                  "docker.io/bitcoin/bitcoin",
		"docker.io/bitcoin/bitcoin:28.1":        "docker.io/bitcoin/bitcoin",
		"index.docker.io/bitcoin/bitcoin":       "docker.io/bitcoin/bitcoin",
		"busybox":                               "docker.io/library/busybox",
		"docker.io/library/busybox:1.36":        "docker.io/library/busybox",
		"docker.io/busybox@sha256:0123456789ab": "docker.io/library/busybox",
		"quay.io/org/img:v1@sha256:abc":         "quay.io/org/img",
		"localhost/img":                         "localhost/img",
		"localhost:5000/img:tag":                "localhost:5000/img",
		"podsim.test/helper:v1":                 "podsim.test/helper",
	} {
		if got := repository(ref); got != want {
			t.Errorf("repository(%q) = %q, want %q", ref, got, want)
		}
	}
}

func TestPodIPs(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < ipCount; i++ {
		ip := podIPAt(i)
		if seen[ip] || podIPIndexOf(ip) != i {
			t.Fatalf("pod IP %d = %s, index back %d", i, ip, podIPIndexOf(ip))
		}
		seen[ip] = true
	}
	for _, bad := range []string{"127.0.0.1", "127.2.0.0", "127.2.3.255", "10.0.0.1", "::1", ""} {
		if podIPIndexOf(bad) >= 0 {
			t.Errorf("%q taken for a pod IP", bad)
		}
	}
}
