package bitcoin

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	bitcoinv1alpha1 "github.com/crdipc/crdipc/api/bitcoin/v1alpha1"
)

// Each implementation's pods get its own program, image, flags and ports; both get the RPC
// credentials from the Secret, an image that is not pulled when the node has it, and a
// preference for distinct machines.
func TestStatefulSetPerImplementation(t *testing.T) {
	for _, tc := range []struct {
		impl           bitcoinv1alpha1.Implementation
		network        bitcoinv1alpha1.Network
		image          string
		p2p, rpc       int32
		args, wantHome []string
	}{
		{impl: "", network: bitcoinv1alpha1.NetworkRegtest, image: bitcoinv1alpha1.BitcoindImage, p2p: 18444, rpc: 18443,
			args: []string{"-regtest=1", "-rpcport=18443", "-rpcuser=$(RPC_USER)", "-rpcpassword=$(RPC_PASSWORD)", "-datadir=/data"}},
		{impl: bitcoinv1alpha1.ImplementationBitcoind, network: bitcoinv1alpha1.NetworkMainnet, image: bitcoinv1alpha1.BitcoindImage, p2p: 8333, rpc: 8332,
			args: []string{"-port=8333", "-rpcport=8332"}},
		{impl: bitcoinv1alpha1.ImplementationBtcd, network: bitcoinv1alpha1.NetworkRegtest, image: bitcoinv1alpha1.BtcdImage, p2p: 18444, rpc: 18334,
			args:     []string{"--regtest", "--listen=:18444", "--rpclisten=:18334", "--rpcuser=$(RPC_USER)", "--rpcpass=$(RPC_PASSWORD)"},
			wantHome: []string{"/data"}},
		{impl: bitcoinv1alpha1.ImplementationBtcd, network: bitcoinv1alpha1.NetworkTestnet, image: bitcoinv1alpha1.BtcdImage, p2p: 18333, rpc: 18334,
			args: []string{"--testnet", "--listen=:18333", "--rpclisten=:18334"}, wantHome: []string{"/data"}},
		{impl: bitcoinv1alpha1.ImplementationBtcd, network: bitcoinv1alpha1.NetworkMainnet, image: bitcoinv1alpha1.BtcdImage, p2p: 8333, rpc: 8334,
			args: []string{"--listen=:8333", "--rpclisten=:8334"}, wantHome: []string{"/data"}},
	} {
		t.Run(string(tc.impl)+"/"+string(tc.network), func(t *testing.T) {
			n := &bitcoinv1alpha1.BitcoinNetwork{
				ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "net", UID: "uid"},
				Spec:       bitcoinv1alpha1.BitcoinNetworkSpec{Nodes: 3, Network: tc.network, Implementation: tc.impl},
			}
			pod := statefulSet(n).Spec.Template.Spec
			c := pod.Containers[0]
			program := string(implementation(n))
			if *c.Name != program || *c.Image != tc.image || !slices.Equal(c.Command, []string{program}) {
				t.Errorf("container %s runs %s %v, want %s running %s", *c.Name, *c.Image, c.Command, tc.image, program)
			}
			if *c.ImagePullPolicy != corev1.PullIfNotPresent {
				t.Errorf("imagePullPolicy %s, want IfNotPresent", *c.ImagePullPolicy)
			}
			for _, a := range tc.args {
				if !slices.Contains(c.Args, a) {
					t.Errorf("args %v lack %s", c.Args, a)
				}
			}
			ports := map[string]int32{}
			for _, p := range c.Ports {
				ports[*p.Name] = *p.ContainerPort
			}
			if ports["p2p"] != tc.p2p || ports["rpc"] != tc.rpc {
				t.Errorf("ports %v, want p2p %d, rpc %d", ports, tc.p2p, tc.rpc)
			}
			var home []string
			fromSecret := 0
			for _, e := range c.Env {
				if *e.Name == "HOME" {
					home = append(home, *e.Value)
				}
				if e.ValueFrom != nil && *e.ValueFrom.SecretKeyRef.Name == "net-rpc" {
					fromSecret++
				}
			}
			if !slices.Equal(home, tc.wantHome) || fromSecret != 2 {
				t.Errorf("env HOME %v and %d values from the secret, want HOME %v and 2", home, fromSecret, tc.wantHome)
			}
			if len(pod.TopologySpreadConstraints) != 1 || *pod.TopologySpreadConstraints[0].TopologyKey != corev1.LabelHostname ||
				*pod.TopologySpreadConstraints[0].WhenUnsatisfiable != corev1.ScheduleAnyway {
				t.Errorf("topology spread %+v, want a preference for distinct hosts", pod.TopologySpreadConstraints)
			}
		})
	}
}

// An image set in the spec wins over the implementation's default.
func TestStatefulSetKeepsTheSpecsImage(t *testing.T) {
	n := &bitcoinv1alpha1.BitcoinNetwork{Spec: bitcoinv1alpha1.BitcoinNetworkSpec{Implementation: bitcoinv1alpha1.ImplementationBtcd, Image: "registry.local/btcd:dev"}}
	if got := *statefulSet(n).Spec.Template.Spec.Containers[0].Image; got != "registry.local/btcd:dev" {
		t.Errorf("image %s, want the spec's", got)
	}
}
