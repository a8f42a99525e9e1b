package controlplane

import (
	"context"
	"fmt"
	"net"
	"strconv"

	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel/trace"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
	"k8s.io/kubernetes/cmd/kube-apiserver/app/options"

	"github.com/crdipc/crdipc/config/crd"
)

// startAPIServer configures kube-apiserver as its command would from flags,
// but runs it under ctx: app.NewAPIServerCommand installs its own signal
// handler and can never be stopped, which an embedded server must be.
//
// advertise, when set, is an address the API server also listens on (ln accepts on both)
// and publishes as the endpoint of the `kubernetes` Service, for clients in pods.
// tp, when set, records the API server's spans.
func startAPIServer(ctx context.Context, ln net.Listener, etcdURL string, p pki, advertise net.IP, tp trace.TracerProvider) (*component, error) {
	registerVersion() // before the options register the default version
	s := options.NewServerRunOptions()
	fs := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	for _, f := range s.Flags().FlagSets {
		fs.AddFlagSet(f)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--etcd-cafile=" + p.etcdCACert,
		"--etcd-certfile=" + p.etcdClientCert,
		"--etcd-keyfile=" + p.etcdClientKey,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + p.servingCert,
		"--tls-private-key-file=" + p.servingKey,
		"--client-ca-file=" + p.caCert,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + p.serviceAccountKey,
		"--service-account-signing-key-file=" + p.serviceAccountKey,
		"--service-cluster-ip-range=" + serviceCIDR,
		"--authorization-mode=Node,RBAC",
		// With the Node authorizer, a kubelet (system:node:<name>) may only write its own
		// Node and the status of its own pods, and may not label itself into another's role.
		"--enable-admission-plugins=NodeRestriction",
		// As kubeadm, kind and k3s do: node plugins (the CSI node DaemonSet) need
		// privileged containers; the default, false, refuses them at admission.
		"--allow-privileged=true",
		// Logs, exec and port-forward go to kubelets as this client, so a kubelet may keep
		// anonymous access off and authorize by webhook (the bootstrap binds the user
		// system:kubelet-api-admin). A node is dialled at its InternalIP first: a kubelet's
		// hostname need not resolve on this machine.
		"--kubelet-client-certificate=" + p.kubeletClientCert,
		"--kubelet-client-key=" + p.kubeletClientKey,
		"--kubelet-preferred-address-types=InternalIP,Hostname,InternalDNS,ExternalDNS,ExternalIP",
		"--enable-priority-and-fairness=true",
		"--profiling=false",
	}
	if advertise != nil {
		// Pods reach the API server through the `kubernetes` Service; the lease reconciler
		// keeps its endpoint at the advertise address (EndpointSlices follow from it).
		args = append(args, "--advertise-address="+advertise.String(), "--endpoint-reconciler-type=lease")
	} else {
		// Nothing outside this machine's loopback can reach the API server, and an
		// endpoint on loopback is refused by validation: the Service gets none, and the
		// reconciler would only add writes.
		args = append(args, "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none")
	}
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("kube-apiserver flags: %w", err)
	}
	s.SecureServing.Listener = ln
	s.SecureServing.BindPort = port
	if err := s.GenericServerRunOptions.ComponentGlobalsRegistry.Set(); err != nil {
		return nil, fmt.Errorf("kube-apiserver feature gates: %w", err)
	}
	// The API server's own loopback clients should not log its warnings.
	rest.SetDefaultWarningHandler(rest.NoWarnings{})

	completed, err := s.Complete(ctx)
	if err != nil {
		return nil, fmt.Errorf("completing kube-apiserver options: %w", err)
	}
	if errs := completed.Validate(); len(errs) != 0 {
		return nil, fmt.Errorf("invalid kube-apiserver options: %w", utilerrors.NewAggregate(errs))
	}
	// Informer names are registered process-wide; a restarted API server in
	// the same process (tests, restart persistence) needs the name freed.
	name, err := cache.NewInformerName("kube-apiserver")
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver informer name: %w", err)
	}
	completed.InformerName = name
	return runComponent("kube-apiserver", func() error {
		defer name.Release()
		return runAPIServer(ctx, completed, tp)
	}), nil
}

// runAPIServer is app.Run, kube-apiserver's command, with crdipc's bootstrap hooks in place
// of two of the API server's own (replaceBootstrapHooks), the built-in APIs' OpenAPI v2
// document built on first use (deferOpenAPIV2), and custom resources decoded with their
// managedFields trees shared and the selectable fields of crdipc's own kinds indexed in
// the watch cache (customResourceStorage), and its spans recorded by tp (useTracerProvider).
func runAPIServer(ctx context.Context, opts options.CompletedOptions, tp trace.TracerProvider) error {
	config, err := app.NewConfig(opts)
	if err != nil {
		return err
	}
	if tp != nil {
		useTracerProvider(config, tp)
	}
	kube := config.KubeAPIs.ControlPlane.Generic
	if err := replaceBootstrapHooks(kube); err != nil {
		return err
	}
	deferOpenAPIV2(kube)
	extra := &config.ApiExtensions.ExtraConfig
	crds, err := crd.CRDs()
	if err != nil {
		return err
	}
	extra.CRDRESTOptionsGetter = customResourceStorage(extra.CRDRESTOptionsGetter, newFieldSets(fieldSetsMaxBytes), selectableFieldIndexes(crds))
	completed, err := config.Complete()
	if err != nil {
		return err
	}
	server, err := app.CreateServerChain(completed)
	if err != nil {
		return err
	}
	if err := installOpenAPI(server.GenericAPIServer.NextDelegate(), kube.OpenAPIConfig, kube.OpenAPIV3Config); err != nil {
		return err
	}
	prepared, err := server.PrepareRun()
	if err != nil {
		return err
	}
	return prepared.Run(ctx)
}

// useTracerProvider has the three servers of kube-apiserver's chain record their spans
// with tp: the aggregator's handler chain, which every request enters, starts a request's
// span (WithTracing, where the traceparent header is read); the storage layers below add
// theirs as children. The etcd client's own gRPC spans are left out: its transport took
// the provider while app.NewConfig ran, before a provider can be set without a tracing
// configuration file.
func useTracerProvider(config *app.Config, tp trace.TracerProvider) {
	// The API server shuts its provider down when it stops; this one outlives it (a
	// restarted control plane, the services of `crdipc up`).
	p := unstoppable{tp}
	config.KubeAPIs.ControlPlane.Generic.TracerProvider = p
	config.ApiExtensions.GenericConfig.TracerProvider = p
	config.Aggregator.GenericConfig.TracerProvider = p
}

// unstoppable is a tracer provider whose owner, not the API server, shuts it down.
type unstoppable struct{ trace.TracerProvider }

func (unstoppable) Shutdown(context.Context) error { return nil }
