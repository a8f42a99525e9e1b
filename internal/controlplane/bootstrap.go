package controlplane

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/component-helpers/auth/rbac/reconciliation"
	"k8s.io/klog/v2"
	schedulingv1 "k8s.io/kubernetes/pkg/apis/scheduling/v1"
	rbacrest "k8s.io/kubernetes/pkg/registry/rbac/rest"
	schedulingrest "k8s.io/kubernetes/pkg/registry/scheduling/rest"
	"k8s.io/kubernetes/plugin/pkg/auth/authorizer/rbac/bootstrappolicy"
)

// The API server's post-start hooks that write the default RBAC policy and the system
// PriorityClasses both begin with wait.Poll, which waits its one-second interval before the
// first try, and /readyz waits for both: on a fresh data dir that second was a third of
// `up`'s start. crdipc disables them and runs hooks of its own that write the same objects
// at once, several at a time.
const (
	hookBootstrapRoles           = "crdipc/bootstrap-roles"
	hookBootstrapPriorityClasses = "crdipc/bootstrap-system-priority-classes"
)

// replaceBootstrapHooks swaps the upstream hooks in c for crdipc's.
func replaceBootstrapHooks(c *genericapiserver.Config) error {
	c.DisabledPostStartHooks.Insert(rbacrest.PostStartHookName, schedulingrest.PostStartHookName)
	if err := c.AddPostStartHook(hookBootstrapRoles, retrying(ensureRBACPolicy)); err != nil {
		return err
	}
	return c.AddPostStartHook(hookBootstrapPriorityClasses, retrying(ensurePriorityClasses))
}

// retrying runs ensure until it succeeds, first at once, for at most 30 s (as upstream's
// hooks): etcd may not answer yet. An error ends the process (the API server's hook runner
// calls klog.Fatal), as upstream's does; a server stopped meanwhile is not an error.
func retrying(ensure func(context.Context, kubernetes.Interface) error) genericapiserver.PostStartHookFunc {
	return func(hc genericapiserver.PostStartHookContext) error {
		client, err := kubernetes.NewForConfig(hc.LoopbackClientConfig)
		if err != nil {
			return err
		}
		var last error
		err = wait.PollUntilContextTimeout(hc, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			last = ensure(ctx, client)
			return last == nil, nil
		})
		if err != nil && hc.Err() == nil {
			return fmt.Errorf("%w (last error: %w)", err, last)
		}
		return nil
	}
}

// bootstrapWriters bounds the writes in flight: enough to overlap the round trips, few
// enough not to crowd out the API server's own start on two cores.
const bootstrapWriters = 8

// ensureRBACPolicy creates or reconciles the API server's default roles and bindings
// (package bootstrappolicy, as upstream's hook), each with conflicts and 503s (storage
// version updates) retried. Upstream's hook also migrates roles and bindings of clusters
// older than Kubernetes 1.9 (ClusterRolesToAggregate, ClusterRoleBindingsToSplit); no
// crdipc data dir predates those.
func ensureRBACPolicy(ctx context.Context, client kubernetes.Interface) error {
	var g errgroup.Group
	g.SetLimit(bootstrapWriters)
	rbac := client.RbacV1()
	run := func(what string, f func() error) {
		g.Go(func() error {
			err := retry.OnError(retry.DefaultBackoff, func(err error) bool {
				return apierrors.IsConflict(err) || apierrors.IsServiceUnavailable(err)
			}, f)
			if err != nil {
				return fmt.Errorf("reconciling %s: %w", what, err)
			}
			return nil
		})
	}
	for _, r := range append(bootstrappolicy.ClusterRoles(), bootstrappolicy.ControllerRoles()...) {
		opts := reconciliation.ReconcileRoleOptions{
			Role: reconciliation.ClusterRoleRuleOwner{ClusterRole: &r}, Client: reconciliation.ClusterRoleModifier{Client: rbac.ClusterRoles()}, Confirm: true,
		}
		run("clusterrole "+r.Name, func() error { _, err := opts.Run(); return err })
	}
	bindings := append(bootstrappolicy.ClusterRoleBindings(), bootstrappolicy.ControllerRoleBindings()...)
	for _, b := range append(bindings, clusterRoleBindings()...) {
		opts := reconciliation.ReconcileRoleBindingOptions{
			RoleBinding: reconciliation.ClusterRoleBindingAdapter{ClusterRoleBinding: &b}, Client: reconciliation.ClusterRoleBindingClientAdapter{Client: rbac.ClusterRoleBindings()}, Confirm: true,
		}
		run("clusterrolebinding "+b.Name, func() error { _, err := opts.Run(); return err })
	}
	for ns, roles := range bootstrappolicy.NamespaceRoles() {
		for _, r := range roles {
			opts := reconciliation.ReconcileRoleOptions{
				Role: reconciliation.RoleRuleOwner{Role: &r}, Client: reconciliation.RoleModifier{Client: rbac, NamespaceClient: client.CoreV1().Namespaces()}, Confirm: true,
			}
			run("role "+ns+"/"+r.Name, func() error { _, err := opts.Run(); return err })
		}
	}
	for ns, bindings := range bootstrappolicy.NamespaceRoleBindings() {
		for _, b := range bindings {
			opts := reconciliation.ReconcileRoleBindingOptions{
				RoleBinding: reconciliation.RoleBindingAdapter{RoleBinding: &b}, Client: reconciliation.RoleBindingClientAdapter{Client: rbac, NamespaceClient: client.CoreV1().Namespaces()}, Confirm: true,
			}
			run("rolebinding "+ns+"/"+b.Name, func() error { _, err := opts.Run(); return err })
		}
	}
	if err := g.Wait(); err != nil {
		return err
	}
	klog.V(2).InfoS("default RBAC policy in place")
	return nil
}

// clusterRoleBindings are what a cluster with nodes needs beyond the API server's default
// policy, as kubeadm binds them: the API server's kubelet client may use every kubelet API
// (logs, exec, metrics) on a kubelet that authorizes by webhook, and kube-proxy, run on a
// node as user system:kube-proxy (crdipc kubeconfig --user system:kube-proxy), may read
// Services and EndpointSlices.
func clusterRoleBindings() []rbacv1.ClusterRoleBinding {
	bind := func(name, role, user string) rbacv1.ClusterRoleBinding {
		return rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/managed-by": "crdipc"}},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
		}
	}
	return []rbacv1.ClusterRoleBinding{
		bind("crdipc:kube-apiserver-kubelet-client", "system:kubelet-api-admin", kubeletClientUser),
		bind("crdipc:kube-proxy", "system:node-proxier", "system:kube-proxy"),
	}
}

// ensurePriorityClasses creates the system PriorityClasses (system-node-critical,
// system-cluster-critical) that do not exist; existing ones are left as they are.
func ensurePriorityClasses(ctx context.Context, client kubernetes.Interface) error {
	var errs []error
	for _, pc := range schedulingv1.SystemPriorityClasses() {
		_, err := client.SchedulingV1().PriorityClasses().Create(ctx, pc, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			errs = append(errs, fmt.Errorf("creating PriorityClass %s: %w", pc.Name, err))
		}
	}
	return errors.Join(errs...)
}
