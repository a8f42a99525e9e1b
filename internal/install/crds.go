package install

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"golang.org/x/sync/errgroup"

	"github.com/crdipc/crdipc/config/crd"
)

// FieldManager names crdipc's writes in managedFields.
const FieldManager = "crdipc-install"

// PodSecurityLabel is the Pod Security admission level label Apply sets on SystemNamespace.
const PodSecurityLabel = "pod-security.kubernetes.io/enforce"

// SystemNamespace holds crdipc's own objects: receiver heartbeat Leases,
// leader election Leases, node fencing Leases.
const SystemNamespace = "crdipc-system"

// Apply installs everything crdipc needs in a cluster before its services
// start: the system namespace and the CRDs (see CRDs).
func Apply(ctx context.Context, cfg *rest.Config) ([]string, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating client: %w", err)
	}
	// The CSI node plugin and the pool agent run here with host paths (and the node plugin
	// privileged, to mount): a cluster enforcing a stricter Pod Security level by default
	// would refuse them, so the namespace says which level it needs.
	ns := corev1ac.Namespace(SystemNamespace).WithLabels(map[string]string{PodSecurityLabel: "privileged"})
	if _, err := kube.CoreV1().Namespaces().Apply(ctx, ns, metav1.ApplyOptions{FieldManager: FieldManager, Force: true}); err != nil {
		return nil, fmt.Errorf("applying namespace %s: %w", SystemNamespace, err)
	}
	return CRDs(ctx, cfg)
}

// CRDs applies every embedded CRD (server-side apply, so re-running it is a
// no-op and a changed schema is an update) and waits until each is
// Established. It returns the names it applied.
func CRDs(ctx context.Context, cfg *rest.Config) ([]string, error) {
	client, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating apiextensions client: %w", err)
	}
	crds, err := crd.CRDs()
	if err != nil {
		return nil, err
	}
	api := client.ApiextensionsV1().CustomResourceDefinitions()
	names := make([]string, 0, len(crds))
	// One after the other: applied at once they took longer (the same CPU, shared
	// differently, and the API server's controllers react to each new CRD).
	for _, c := range crds {
		c.TypeMeta = metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"}
		body, err := json.Marshal(c)
		if err != nil {
			return nil, fmt.Errorf("encoding CRD %s: %w", c.Name, err)
		}
		force := true
		if _, err := api.Patch(ctx, c.Name, types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: FieldManager, Force: &force}); err != nil {
			return nil, fmt.Errorf("applying CRD %s: %w", c.Name, err)
		}
		names = append(names, c.Name)
	}
	for _, name := range names {
		if err := waitEstablished(ctx, client, name); err != nil {
			return nil, err
		}
	}
	if err := waitServed(ctx, client.Discovery(), crds); err != nil {
		return nil, err
	}
	return names, nil
}

// waitServed returns once API discovery lists every served version of every CRD and each
// can be listed. Established is not enough for either:
//   - the discovery document is updated a moment later, and a client that reads it in
//     between (controller-runtime's REST mapper caches a group's kinds on first use) finds
//     some kinds of a group and not the others, and goes on answering "no matches for kind";
//   - a new resource's watch cache starts empty and initializes in the background; until it
//     has, the API server answers lists with 429 and Retry-After: 1, and client-go waits that
//     whole second: every service of up, starting at once, would pay it. Asking here,
//     without client-go's retry, every 20 ms, takes the moment the caches need instead.
func waitServed(ctx context.Context, dc discovery.DiscoveryInterface, crds []*apiextensionsv1.CustomResourceDefinition) error {
	g, ctx := errgroup.WithContext(ctx)
	for _, c := range crds {
		for _, v := range c.Spec.Versions {
			if !v.Served {
				continue
			}
			g.Go(func() error { return waitVersionServed(ctx, dc, c, v.Name) })
		}
	}
	return g.Wait()
}

// waitVersionServed waits until discovery lists version of CRD c and it can be listed.
func waitVersionServed(ctx context.Context, dc discovery.DiscoveryInterface, c *apiextensionsv1.CustomResourceDefinition, version string) error {
	gv := c.Spec.Group + "/" + version
	path := "/apis/" + gv + "/" + c.Spec.Names.Plural
	var last error
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := dc.ServerResourcesForGroupVersion(gv)
		if err != nil {
			last = err // the group itself is not listed yet
			return false, nil
		}
		if !slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == c.Spec.Names.Plural }) {
			last = fmt.Errorf("discovery does not list %s yet", c.Spec.Names.Plural)
			return false, nil
		}
		last = dc.RESTClient().Get().AbsPath(path).Param("limit", "1").MaxRetries(0).Do(ctx).Error()
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("waiting until %s is served: %w (last answer: %v)", path, err, last)
	}
	return nil
}

// waitEstablished watches one CRD until its Established condition is True.
func waitEstablished(ctx context.Context, client apiextensionsclient.Interface, name string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	api := client.ApiextensionsV1().CustomResourceDefinitions()
	for {
		got, err := api.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading CRD %s: %w", name, err)
		}
		if established(got) {
			return nil
		}
		w, err := api.Watch(ctx, metav1.ListOptions{
			FieldSelector:   fields.OneTermEqualSelector("metadata.name", name).String(),
			ResourceVersion: got.ResourceVersion,
		})
		if err != nil {
			return fmt.Errorf("watching CRD %s: %w", name, err)
		}
		for ev := range w.ResultChan() {
			if c, ok := ev.Object.(*apiextensionsv1.CustomResourceDefinition); ok && ev.Type != watch.Deleted && established(c) {
				w.Stop()
				return nil
			}
		}
		w.Stop()
		if ctx.Err() != nil {
			return fmt.Errorf("waiting for CRD %s to be Established: %w", name, ctx.Err())
		}
		// The watch closed early (timeout, server restart): read and watch again.
	}
}

func established(c *apiextensionsv1.CustomResourceDefinition) bool {
	for _, cond := range c.Status.Conditions {
		if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}
