package bench

import (
	"reflect"
	"testing"
)

// What `crdipc up` prints, as it prints it: the phases up to the line saying it is up, the
// lines after it (none of them phases) and, once interrupted, the stop.
const upOutput = `crdipc up: data dir /tmp/x/.crdipc
  certificates                     20 ms
  etcd                             22 ms
  kube-apiserver serving         1840 ms
  13 CRDs established             797 ms
  kube-apiserver ready, installed    190 ms
  controllers                       3 ms
  services: books, storage-operator, pool-agent, csi-driver    261 ms
crdipc is up in 3.13 s; API server https://127.0.0.1:40361

  metrics  http://127.0.0.1:8080/metrics   health http://127.0.0.1:8081/readyz
  some later line                   12 ms

export KUBECONFIG=/tmp/x/.crdipc/kubeconfig

Ctrl-C to stop.
stopped in 1.4 s
`

func TestParseUpOutput(t *testing.T) {
	s, err := ParseUpOutput(upOutput)
	if err != nil {
		t.Fatal(err)
	}
	want := &UpStart{Seconds: 3.13, StopSeconds: 1.4, Phases: []UpPhase{
		{"certificates", 20}, {"etcd", 22}, {"kube-apiserver serving", 1840}, {"13 CRDs established", 797},
		{"kube-apiserver ready, installed", 190}, {"controllers", 3}, {"services", 261},
	}}
	if !reflect.DeepEqual(s, want) {
		t.Fatalf("got %+v\nwant %+v", s, want)
	}
	if _, err := ParseUpOutput("crdipc up: data dir x\n  etcd  22 ms\nError: port taken\n"); err == nil {
		t.Fatal("output of an up that never came up: no error")
	}
}
