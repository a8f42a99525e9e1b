// Package console is the live web console `crdipc up` serves: one page, embedded in the
// binary, that shows the cluster as crdipc's services see it — nodes → pools → replicas with
// phase and rebuild progress, volumes and the nodes that use them, requests in flight and
// recent completions with their latency, webhook deliveries, and Bitcoin networks with their
// peer links.
//
// The data comes from informers (a controller-runtime cache of its own), never from polling:
// every change marks the state dirty, and at most five times a second the console renders a
// snapshot and sends it to each browser over server-sent events (GET /events). A browser gets
// the latest snapshot when it connects, and only the latest one if it falls behind, so a slow
// client costs one buffered message. Every list in a snapshot is capped.
//
// With a trace source (Options.Traces: up's in-memory tracing.Store), each request shows a
// link to its trace, whose ID the request object carries in its traceparent annotation; the
// page draws the trace as a waterfall, one bar per span under its parent, read from
// GET /traces/<trace id> and opened by the URL's #trace=<trace id>. GET /traces lists the
// recent traces for scripts.
//
// The page (index.html, console.js, console.css) is plain HTML, CSS and JavaScript embedded
// with go:embed: no framework, font or CDN is fetched, so it works on an offline machine.
//
// It only reads, and only what the page shows: in `crdipc up` it runs as the ServiceAccount
// crdipc-console (config/rbac/console), never as up's admin.
// +kubebuilder:rbac:groups="",resources=nodes;pods;persistentvolumeclaims;events,verbs=get;list;watch
// +kubebuilder:rbac:groups=storage.crdipc.io,resources=cstorpools;cstorvolumereplicas;cstorvolumes;storagepoolclaims;volumebackups,verbs=get;list;watch
// +kubebuilder:rbac:groups=library.crdipc.io,resources=books,verbs=get;list;watch
// +kubebuilder:rbac:groups=scm.crdipc.io,resources=pullrequests;branches,verbs=get;list;watch
// +kubebuilder:rbac:groups=bitcoin.crdipc.io,resources=bitcoinnetworks,verbs=get;list;watch
package console
