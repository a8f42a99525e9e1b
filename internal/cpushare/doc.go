// Package cpushare attributes a process's CPU time to the components that run in it.
//
// crdipc up, the benches and the integration tests run etcd, kube-apiserver,
// kube-controller-manager and crdipc's services in one process, whose CPU time alone cannot
// say which of them is busy. Each component is started under a pprof label that names it
// (Do): goroutines inherit the labels of the goroutine that starts them, so everything a
// component starts is counted as its own, and a CPU profile of the process
// (`crdipc bench --cpu-profile`) can be cut by component (`go tool pprof -tagfocus
// crdipc.component=etcd`). Measure samples the CPU profiler for a window and adds its
// samples up by component.
//
// The attribution is by who started a goroutine, not by whom it works for: the API server's
// handlers count as kube-apiserver whichever client they serve, and an HTTP/2 connection's
// reader counts for the component that dialled it, although components with the same TLS
// settings share client-go's transports. The Go runtime's own goroutines (the garbage
// collector's background workers) carry no label and are reported as Unattributed.
package cpushare
