package services

import (
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/crdipc/crdipc/internal/bitcoin"
)

func bitcoinOperatorEntry() Entry {
	return Entry{
		Name:  "bitcoin-operator",
		Short: "Run the BitcoinNetwork operator (seed 002)",
		Long: `bitcoin-operator reconciles BitcoinNetworks (bitcoin.crdipc.io): for each it keeps a
StatefulSet of spec.nodes pods of spec.implementation (bitcoind, or btcd), a headless
Service and (unless spec.secretName names one) a Secret with generated RPC credentials,
all owned by the network. Whenever a pod becomes ready it introduces it to the other
ready nodes over the node's JSON-RPC (addnode; HTTPS for btcd), and reports nodes,
readyNodes, peers and Ready=True once every node is ready and connected to every other.

Run two replicas for availability: leader election lets only one act.`,
		Kind: Controllers,
		New:  func() Service { return &bitcoinService{} },
	}
}

type bitcoinService struct{ o bitcoin.Options }

func (s *bitcoinService) AddFlags(fs *pflag.FlagSet) {
	fs.DurationVar(&s.o.RPCTimeout, "rpc-timeout", 0, "timeout of one JSON-RPC call to a node (default 5s)")
	fs.DurationVar(&s.o.Resync, "resync", 0, "how often a Ready network is checked again (default 30s)")
}

// CacheOptions caches only the networks' pods, not every pod of the cluster.
func (s *bitcoinService) CacheOptions() (cache.Options, error) {
	req, err := labels.NewRequirement(bitcoin.NetworkLabel, selection.Exists, nil)
	if err != nil {
		return cache.Options{}, err
	}
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&corev1.Pod{}: {Label: labels.NewSelector().Add(*req)},
	}}, nil
}

func (s *bitcoinService) Setup(mgr manager.Manager, env Env) error {
	o := s.o
	o.TracerProvider = env.TracerProvider("bitcoin-operator")
	return bitcoin.Add(mgr, o)
}
