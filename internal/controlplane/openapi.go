package controlplane

import (
	"fmt"

	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/routes"
	"k8s.io/kube-openapi/pkg/builder"
	"k8s.io/kube-openapi/pkg/cached"
	"k8s.io/kube-openapi/pkg/common"
	"k8s.io/kube-openapi/pkg/common/restfuladapter"
	"k8s.io/kube-openapi/pkg/handler"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// deferOpenAPIV2 keeps kube-apiserver (the server of the built-in APIs, in the middle of
// the chain) from building its OpenAPI v2 document in PrepareRun, before it serves: that
// walks every built-in route on one core (about 0.1 s of up's start, measured).
// installOpenAPI then serves the same document, built when first asked for; no client of
// crdipc's start asks for v2 (kubectl and the admission plugins read v3, the aggregator
// merges v2 lazily), so the cost leaves the start.
func deferOpenAPIV2(c *genericapiserver.Config) {
	c.SkipOpenAPIInstallation = true
}

// installOpenAPI does for kube-apiserver what PrepareRun would have done: /openapi/v3 as
// upstream builds it, /openapi/v2 the same document as upstream's, built once on the first
// request. Called once every route is installed (after CreateServerChain).
func installOpenAPI(s genericapiserver.DelegationTarget, v2 *common.Config, v3 *common.OpenAPIV3Config) error {
	kube, ok := s.(*genericapiserver.GenericAPIServer)
	if !ok {
		return fmt.Errorf("installing OpenAPI: kube-apiserver is a %T, not a *GenericAPIServer", s)
	}
	container, mux := kube.Handler.GoRestfulContainer, kube.Handler.NonGoRestfulMux
	if v2 != nil {
		build := cached.Func(func() (*spec.Swagger, string, error) {
			sw, err := builder.BuildOpenAPISpecFromRoutes(restfuladapter.AdaptWebServices(container.RegisteredWebServices()), v2)
			if err != nil {
				return nil, "", fmt.Errorf("building the OpenAPI v2 document: %w", err)
			}
			sw.Definitions = handler.PruneDefaults(sw.Definitions)
			return sw, "built-in", nil
		})
		kube.OpenAPIVersionedService = handler.NewOpenAPIServiceLazy(cached.Once(build))
		kube.OpenAPIVersionedService.RegisterOpenAPIVersionedService("/openapi/v2", mux)
	}
	if v3 != nil {
		kube.OpenAPIV3VersionedService = routes.OpenAPI{V3Config: v3}.InstallV3(container, mux)
	}
	return nil
}
